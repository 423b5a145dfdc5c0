package dnsproxy

import (
	"strings"

	"github.com/ctld/ctld/internal/netpolicy"
)

// matcher is one domain set's names, compiled for lookups: the exact
// names, and the suffixes (".example.com") of its "*.example.com"
// patterns, which match names strictly below the suffix.
type matcher struct {
	exact    map[string]bool
	suffixes []string
}

func compile(ds netpolicy.DomainSet) matcher {
	m := matcher{exact: map[string]bool{}}
	for _, n := range ds.Names {
		if s, ok := strings.CutPrefix(n, "*"); ok {
			m.suffixes = append(m.suffixes, s) // keeps the dot: ".example.com"
			continue
		}
		m.exact[n] = true
	}
	return m
}

func (m matcher) match(name string) bool {
	if m.exact[name] {
		return true
	}
	for _, s := range m.suffixes {
		// strings.HasSuffix with the leading dot: "example.com" itself and
		// "badexample.com" do not match "*.example.com".
		if len(name) > len(s) && strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// queryName is a question's name in the form policies use (lower case,
// no trailing dot), and whether it is a plain host name at all. Names
// with any other byte (the presentation form's escapes such as "\." or
// "\195") are refused: a label holding an escaped dot would otherwise
// look like a name below a suffix it is not below.
func queryName(qname string) (string, bool) {
	name := strings.ToLower(strings.TrimSuffix(qname, "."))
	if name == "" || len(name) > netpolicy.MaxNameLen {
		return "", false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return "", false
		}
	}
	if strings.HasPrefix(name, ".") || strings.Contains(name, "..") {
		return "", false
	}
	return name, true
}
