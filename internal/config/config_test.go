package config

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

type opts struct {
	name  string
	n     int64
	port  uint32
	on    bool
	wait  time.Duration
	ratio float64
	list  []string
}

func flags(o *opts) *pflag.FlagSet {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.StringVar(&o.name, "name", "x", "a name\nover two lines")
	fs.Int64Var(&o.n, "n", 7, "a number")
	fs.Uint32Var(&o.port, "port", 80, "a port")
	fs.BoolVar(&o.on, "on", false, "a switch")
	fs.DurationVar(&o.wait, "wait", time.Minute, "a wait")
	fs.Float64Var(&o.ratio, "ratio", 0.5, "a ratio")
	fs.StringSliceVar(&o.list, "list", []string{"a", "b"}, "a list")
	return fs
}

func TestApplySetsTypedValues(t *testing.T) {
	var o opts
	fs := flags(&o)
	f, err := Parse("c.toml", []byte("name = \"y\"\nn = 9\nport = 443\non = true\nwait = \"90s\"\nratio = 2\nlist = [\"c\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Apply(fs); err != nil {
		t.Fatal(err)
	}
	if o.name != "y" || o.n != 9 || o.port != 443 || !o.on || o.wait != 90*time.Second || o.ratio != 2 || len(o.list) != 1 || o.list[0] != "c" {
		t.Fatalf("got %+v", o)
	}
}

func TestCommandLineWins(t *testing.T) {
	var o opts
	fs := flags(&o)
	if err := fs.Parse([]string{"--n", "3", "--list", "z"}); err != nil {
		t.Fatal(err)
	}
	f, err := Parse("c.toml", []byte("n = 9\nname = \"y\"\nlist = [\"c\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Apply(fs); err != nil {
		t.Fatal(err)
	}
	if o.n != 3 || o.name != "y" || len(o.list) != 1 || o.list[0] != "z" {
		t.Fatalf("got %+v", o)
	}
}

func TestErrorsNameFileLineAndKey(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"n = 1\nbogus = 2\n", `c.toml:2: key "bogus": unknown setting`},
		{"\n\nn = \"many\"\n", `c.toml:3: key "n": want an integer, got a string`},
		{"port = 99999999999\n", `c.toml:1: key "port"`},
		{"wait = 5\n", `c.toml:1: key "wait": want a duration string`},
		{"wait = \"5 parsecs\"\n", `c.toml:1: key "wait": invalid argument`},
		{"on = \"yes\"\n", `c.toml:1: key "on": want true or false`},
		{"list = \"a\"\n", `c.toml:1: key "list": want an array`},
		{"[table]\nn = 1\n", `c.toml:1: key "table": unknown setting`},
		{"n = = 1\n", `c.toml:1: `},
	} {
		var o opts
		f, err := Parse("c.toml", []byte(tc.src))
		if err == nil {
			err = f.Apply(flags(&o))
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.src, err, tc.want)
		}
	}
}

func TestReadMissing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "none.toml")
	if f, err := Read(p, false); err != nil || len(f.settings) != 0 {
		t.Fatalf("missing default file: %v", err)
	}
	if _, err := Read(p, true); err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("missing explicit file: %v", err)
	}
	big := filepath.Join(t.TempDir(), "big.toml")
	os.WriteFile(big, bytes.Repeat([]byte("#"), maxFileBytes+1), 0o644)
	if _, err := Read(big, true); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("oversized file: %v", err)
	}
}

func TestApplyKeysMapsAndIgnoresOthers(t *testing.T) {
	var o opts
	fs := flags(&o)
	f, err := Parse("c.toml", []byte("block-store = \"s3://b\"\nother = 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.ApplyKeys(fs, map[string]string{"block-store": "name"}); err != nil {
		t.Fatal(err)
	}
	if o.name != "s3://b" || !f.Has("other") || f.Has("n") {
		t.Fatalf("got %+v", o)
	}
}

// The default file changes nothing as printed, and with every line
// uncommented it parses back to the defaults.
func TestDefaultRoundTrip(t *testing.T) {
	var o opts
	var buf bytes.Buffer
	if err := WriteDefault(&buf, "ctld test\nheader", flags(&o)); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"# ctld test\n# header\n", "# a name\n# over two lines\n#name = \"x\"\n", "#wait = \"1m0s\"\n", "#list = [\"a\", \"b\"]\n", "#ratio = 0.5\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("default file lacks %q:\n%s", want, out)
		}
	}
	uncommented := regexpUncomment(out)
	for _, src := range []string{out, uncommented} {
		var got opts
		fs := flags(&got)
		f, err := Parse("d.toml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Apply(fs); err != nil {
			t.Fatal(err)
		}
		var want opts
		flags(&want)
		if got.name != want.name || got.n != want.n || got.port != want.port || got.on != want.on || got.wait != want.wait || got.ratio != want.ratio || strings.Join(got.list, ",") != strings.Join(want.list, ",") {
			t.Fatalf("round trip: got %+v want %+v", got, want)
		}
	}
	if n := strings.Count(uncommented, " = "); n != 7 {
		t.Fatalf("uncommented %d settings, want 7:\n%s", n, uncommented)
	}
}

// regexpUncomment uncomments the settings of a default file.
func regexpUncomment(s string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if strings.HasPrefix(l, "#") && !strings.HasPrefix(l, "# ") && strings.Contains(l, " = ") {
			l = l[1:]
		}
		b.WriteString(l)
	}
	return b.String()
}
