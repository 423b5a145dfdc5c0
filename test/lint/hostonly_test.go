package lint

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// kernelTestMarks are what a test that needs the VM calls: ktest's
// requirements (which fail in the VM when a feature is missing), its leak
// check, the VM's quota disk and its test host.
var kernelTestMarks = regexp.MustCompile(`ktest\.(Require\w*|CheckLeaks|QuotaDir|NewTestHost|Asked)\(`)

// makeVar is the value of `NAME ?= ...` in the Makefile, continuation lines
// joined.
func makeVar(t *testing.T, makefile, name string) string {
	t.Helper()
	var val []string
	in := false
	for _, line := range strings.Split(makefile, "\n") {
		if !in {
			v, ok := strings.CutPrefix(line, name+" ?=")
			if !ok {
				continue
			}
			line, in = v, true
		}
		cont := strings.HasSuffix(line, `\`)
		val = append(val, strings.TrimSuffix(line, `\`))
		if !cont {
			return strings.Join(strings.Fields(strings.Join(val, " ")), " ")
		}
	}
	t.Fatalf("no %s ?= in the Makefile", name)
	return ""
}

// TestHostOnlyPackagesHaveNoKernelTests: `make test` runs the packages of
// VM_HOST_ONLY_PKGS only on the host, where kernel tests skip, so a kernel
// test in one of them would never run anywhere.
func TestHostOnlyPackagesHaveNoKernelTests(t *testing.T) {
	root := moduleRoot(t)
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	pkgs := strings.Fields(makeVar(t, string(mk), "VM_HOST_ONLY_PKGS"))
	if len(pkgs) == 0 {
		t.Fatal("VM_HOST_ONLY_PKGS is empty")
	}
	for _, p := range pkgs {
		tests, err := filepath.Glob(filepath.Join(root, p, "*_test.go"))
		if err != nil || len(tests) == 0 {
			t.Errorf("VM_HOST_ONLY_PKGS names %s, which has no tests (moved or removed?)", p)
			continue
		}
		for _, f := range tests {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if m := kernelTestMarks.Find(b); m != nil {
				rel, _ := filepath.Rel(root, f)
				t.Errorf("%s calls %s: a kernel test in a VM_HOST_ONLY_PKGS package never runs in the VM; take %s out of the list", rel, m, p)
			}
		}
	}
}
