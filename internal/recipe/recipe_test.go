package recipe

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// repoRoot is the module's root (the shipped recipes are in templates/).
func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func TestShippedRecipes(t *testing.T) {
	for name, langs := range map[string][]string{"python": {"python", "sh"}, "node": {"node", "sh"}} {
		b, err := os.ReadFile(filepath.Join(repoRoot(t), "templates", name+".toml"))
		if err != nil {
			t.Fatal(err)
		}
		r, err := Parse(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !slices.Equal(r.Languages, langs) || r.Base.Suite != "bookworm" || len(r.Packages) != 1 {
			t.Errorf("%s: %+v", name, r)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for _, c := range []struct{ name, toml, want string }{
		{"unknown key", "[base]\nsuite = \"bookworm\"\nsuit = \"x\"\n", "unknown keys base.suit"},
		{"no suite", "packages = [\"python3\"]\n", "base.suite \"\""},
		{"bad package", "packages = [\"python3; rm -rf /\"]\n[base]\nsuite = \"bookworm\"\n", "not a Debian package name"},
		{"bad variant", "[base]\nsuite = \"bookworm\"\nvariant = \"custom\"\n", "base.variant"},
		{"bad mirror", "[base]\nsuite = \"bookworm\"\nmirror = \"file:///etc\"\n", "base.mirror"},
		{"unknown language", "languages = [\"cobol\"]\n[base]\nsuite = \"bookworm\"\n", "unknown language \"cobol\""},
		{"path escapes", "[base]\nsuite = \"bookworm\"\n[[file]]\npath = \"/etc/../../x\"\ncontent = \"\"\n", "file path"},
		{"relative path", "[base]\nsuite = \"bookworm\"\n[[file]]\npath = \"etc/x\"\ncontent = \"\"\n", "file path"},
		{"shell in path", "[base]\nsuite = \"bookworm\"\n[[file]]\npath = \"/etc/$(reboot)\"\ncontent = \"\"\n", "file path"},
		{"space in path", "[base]\nsuite = \"bookworm\"\n[[file]]\npath = \"/etc/a b\"\ncontent = \"\"\n", "file path"},
		{"bad mode", "[base]\nsuite = \"bookworm\"\n[[file]]\npath = \"/etc/x\"\ncontent = \"\"\nmode = \"rw\"\n", "not octal"},
		{"mode too big", "[base]\nsuite = \"bookworm\"\n[[file]]\npath = \"/etc/x\"\ncontent = \"\"\nmode = \"17777\"\n", "not octal"},
		{"twice", "[base]\nsuite = \"bookworm\"\n[[file]]\npath = \"/etc/x\"\ncontent = \"\"\n[[file]]\npath = \"/etc/x\"\ncontent = \"\"\n", "twice"},
		{"empty command", "commands = [\" \"]\n[base]\nsuite = \"bookworm\"\n", "command 1"},
		{"not toml", "[base\n", "parse recipe"},
		{"large file", "[base]\nsuite = \"bookworm\"\n[[file]]\npath = \"/etc/x\"\ncontent = \"" + strings.Repeat("x", MaxFileBytes+1) + "\"\n", "at most 262144"},
	} {
		_, err := Parse([]byte(c.toml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
	if _, err := Parse(make([]byte, MaxRecipeBytes+1)); err == nil {
		t.Error("a recipe over the size cap parsed")
	}
}

func TestDigests(t *testing.T) {
	parse := func(s string) Recipe {
		t.Helper()
		r, err := Parse([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := parse("packages = [\"b\", \"a\"]\n[base]\nsuite = \"bookworm\"\n")
	// The same meaning (order, defaults spelled out): the same digests.
	same := parse("packages = [\"a\", \"b\", \"a\"]\nsize = \"1Gi\"\n[base]\nsuite = \"bookworm\"\nvariant = \"minbase\"\nmirror = \"" + DefaultMirror + "\"\n")
	if a.Digest() != same.Digest() || a.TreeDigest() != same.TreeDigest() {
		t.Fatal("the same recipe spelled differently has another digest")
	}
	// Languages and size change the template, not the tree.
	langs := parse("languages = [\"sh\"]\npackages = [\"a\", \"b\"]\n[base]\nsuite = \"bookworm\"\n")
	if langs.Digest() == a.Digest() || langs.TreeDigest() != a.TreeDigest() {
		t.Fatal("languages: want another recipe digest over the same tree")
	}
	for _, s := range []string{
		"packages = [\"a\"]\n[base]\nsuite = \"bookworm\"\n",
		"packages = [\"a\", \"b\"]\n[base]\nsuite = \"trixie\"\n",
		"packages = [\"a\", \"b\"]\ncommands = [\"true\"]\n[base]\nsuite = \"bookworm\"\n",
		"packages = [\"a\", \"b\"]\n[base]\nsuite = \"bookworm\"\n[[file]]\npath = \"/x\"\ncontent = \"1\"\n",
	} {
		if parse(s).TreeDigest() == a.TreeDigest() {
			t.Errorf("another tree, the same digest:\n%s", s)
		}
	}
}

func TestArgs(t *testing.T) {
	r, err := Parse([]byte(`languages = ["python"]
packages = ["python3", "git"]
commands = ["useradd user"]
[base]
suite = "bookworm"
[[file]]
path = "/etc/app/conf"
content = "x"
mode = "0600"
`))
	if err != nil {
		t.Fatal(err)
	}
	got := Args(r, "/c/w/stage", "/c/w/commands.sh", "/c/w/root")
	want := []string{
		"--mode=root", "--format=directory", "--variant=minbase", "--include=git,python3",
		`--customize-hook=chroot "$1" mkdir -p /etc/app`,
		"--customize-hook=upload /c/w/stage/0 /etc/app/conf",
		`--customize-hook=chroot "$1" chmod 0600 /etc/app/conf`,
		"--customize-hook=upload /c/w/commands.sh /ctl-recipe.sh",
		`--customize-hook=chroot "$1" /bin/sh -e /ctl-recipe.sh`,
		`--customize-hook=rm -f "$1/ctl-recipe.sh"`,
		"bookworm", "/c/w/root", DefaultMirror,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("args:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if s := string(Script(r)); s != "set -eu\nuseradd user\n" {
		t.Fatalf("script %q", s)
	}
}
