package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/ctld/ctld/internal/config"
)

func writeConfig(t *testing.T, dir, src string) string {
	t.Helper()
	p := filepath.Join(dir, "ctld.toml")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Every flag of `ctld run` is a setting; the command line wins; mistakes
// name the file, line and key and exit 2 before anything runs.
func TestRunConfigFile(t *testing.T) {
	dir := t.TempDir()
	base := []string{"--state-dir", dir + "/state", "--run-dir", dir + "/run"}
	for _, tc := range []struct {
		src  string
		args []string
		want string
	}{
		// The file's value reaches the run's check.
		{"max-concurrent-claims = 0\n", nil, "--max-concurrent-claims and --max-concurrent-execs must be at least 1, got 0 and 32"},
		// The slot too (any flag), and the network's and block store's flags.
		{"slot = \"c\"\n", nil, `--slot must be a or b, got "c"`},
		{"net-max-rules = 0\n", nil, "--net-max-rules must be between 1 and 256"},
		{"writer-dead-conn-timeout = \"1s\"\n", nil, "--writer-dead-conn-timeout must be at least"},
		{"log-level = \"loud\"\n", nil, `--log-level: log level "loud" is not one of debug, info, warn, error`},
		{"log-format = \"xml\"\n", nil, `--log-format: log format "xml" is not text or json`},
		// The command line wins: claims pass, the file's max-file-bytes fails.
		{"max-concurrent-claims = 0\nmax-file-bytes = 0\n", []string{"--max-concurrent-claims", "4"}, "--max-file-bytes must be at least 1, got 0"},
		{"# comment\n\nbogus-flag = 1\n", nil, `ctld.toml:3: key "bogus-flag": unknown setting`},
		{"max-concurrent-claims = \"8\"\n", nil, `ctld.toml:1: key "max-concurrent-claims": want an integer, got a string`},
		{"journal-retention = 60\n", nil, `key "journal-retention": want a duration string`},
		{"journal-retention = \"forever\"\n", nil, `key "journal-retention": invalid argument "forever"`},
		{"max-concurrent-claims = \n", nil, "ctld.toml:1: "},
		{"runsc-platform = \"gvisor\"\n", nil, `--runsc-platform: unknown platform "gvisor"`},
		{"warm-pool-max-age = \"30s\"\n", nil, "--warm-pool-max-age must be at least 1m0s, got 30s"},
		{"warm-pool-budget = 1001\n", nil, "--warm-pool-budget must be between 0 and 1000, got 1001"},
	} {
		p := writeConfig(t, dir, tc.src)
		args := append(append(append([]string{}, base...), "--config", p, "run"), tc.args...)
		if tc.src != "slot = \"c\"\n" {
			args = append(args, "--slot", "a")
		}
		r := ctld(t, args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q %v: exit %d, stderr %q; want 2 and %q", tc.src, tc.args, r.code, r.stderr, tc.want)
		}
	}
	// A missing explicit file is an error; the default one may be missing.
	if r := ctld(t, append(base, "--config", dir+"/none.toml", "run", "--slot", "a")...); r.code != exitUsage || !strings.Contains(r.stderr, dir+"/none.toml") {
		t.Errorf("missing --config file: %+v", r)
	}
	if err := applyConfig(runCmd(&globalOpts{}), dir+"/none.toml"); err != nil {
		t.Errorf("missing default file: %v", err)
	}
}

// status reads the directories from the file (and nothing else of it).
func TestStatusConfigDirs(t *testing.T) {
	dir := t.TempDir()
	p := writeConfig(t, dir, "run-dir = \""+dir+"/elsewhere\"\nmax-concurrent-claims = 3\n")
	r := ctld(t, "--config", p, "status", "--json")
	if r.code != exitOK || !strings.Contains(r.stdout, dir+"/elsewhere/ctld-a.sock") {
		t.Fatalf("status: %+v", r)
	}
	r = ctld(t, "--config", p, "--run-dir", dir+"/flag", "status", "--json")
	if r.code != exitOK || !strings.Contains(r.stdout, dir+"/flag/ctld-a.sock") {
		t.Fatalf("status with --run-dir: %+v", r)
	}
}

// `ctld config default` lists every flag of `ctld run` and the global
// directories with its usage; as printed it changes nothing, and with each
// setting uncommented it parses back to every default.
func TestConfigDefaultRoundTrip(t *testing.T) {
	r := ctld(t, "config", "default")
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("config default: %+v", r)
	}
	want := configFlags()
	n := 0
	want.VisitAll(func(f *pflag.Flag) {
		n++
		if !strings.Contains(r.stdout, "\n#"+f.Name+" = ") || !strings.Contains(r.stdout, strings.Split(f.Usage, "\n")[0]) {
			t.Errorf("default file lacks --%s", f.Name)
		}
	})
	if n < 50 || !strings.Contains(r.stdout, "\n#log-level = \"info\"\n") || !strings.Contains(r.stdout, "\n#block-store = \"\"\n") {
		t.Fatalf("default file has %d settings:\n%s", n, r.stdout)
	}
	var un strings.Builder
	for _, l := range strings.SplitAfter(r.stdout, "\n") {
		if strings.HasPrefix(l, "#") && !strings.HasPrefix(l, "# ") && l != "#\n" {
			l = l[1:]
		}
		un.WriteString(l)
	}
	for _, src := range []string{r.stdout, un.String()} {
		f, err := config.Parse("default.toml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		got := configFlags()
		if err := f.Apply(got); err != nil {
			t.Fatal(err)
		}
		set := 0
		got.VisitAll(func(fl *pflag.Flag) {
			if fl.Changed {
				set++
			}
			if fl.Value.String() != want.Lookup(fl.Name).Value.String() {
				t.Errorf("--%s: %q after the round trip, default %q", fl.Name, fl.Value.String(), want.Lookup(fl.Name).Value.String())
			}
		})
		if src != r.stdout && set != n {
			t.Errorf("uncommented file set %d of %d settings", set, n)
		}
	}
}
