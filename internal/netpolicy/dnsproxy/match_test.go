package dnsproxy

import (
	"testing"

	"github.com/ctld/ctld/internal/netpolicy"
)

func TestMatch(t *testing.T) {
	m := compile(netpolicy.DomainSet{Names: []string{"*.example.com", "api.github.com", "*.a.b.test"}})
	for name, want := range map[string]bool{
		"www.example.com":       true,
		"a.b.c.example.com":     true,
		"example.com":           false, // strictly below
		"badexample.com":        false,
		"example.com.evil":      false,
		"api.github.com":        true,
		"www.api.github.com":    false, // exact names are exact
		"github.com":            false,
		"x.a.b.test":            true,
		"a.b.test":              false,
		"b.test":                false,
		"www.example.community": false,
	} {
		if got := m.match(name); got != want {
			t.Errorf("match(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestQueryName(t *testing.T) {
	for q, want := range map[string]string{
		"WWW.Example.COM.":    "www.example.com",
		"www.example.com":     "www.example.com",
		"_dmarc.example.com.": "_dmarc.example.com",
		`evil\.example.com.`:  "",
		`x\000.example.com.`:  "",
		`a\ b.example.com.`:   "",
		".":                   "",
		"":                    "",
		"a..example.com.":     "",
	} {
		got, ok := queryName(q)
		if ok != (want != "") || got != want {
			t.Errorf("queryName(%q) = %q, %v; want %q", q, got, ok, want)
		}
	}
}
