package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
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

// kernelOnlyRun matches a VM_HOST_ONLY `-pkg-run 'PKG=^TestKernel'`: in the
// VM, PKG runs only its TestKernel* tests (the unit stage runs the rest).
var kernelOnlyRun = regexp.MustCompile(`-pkg-run '([^=']+)=\^TestKernel'`)

// TestKernelOnlyPackagesNameTheirKernelTests: a package that runs only its
// TestKernel* tests in the VM must name every test that needs the kernel so
// (calls a kernel mark itself or through a function of the package), or
// that test never runs anywhere.
func TestKernelOnlyPackagesNameTheirKernelTests(t *testing.T) {
	root := moduleRoot(t)
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	runs := kernelOnlyRun.FindAllStringSubmatch(makeVar(t, string(mk), "VM_HOST_ONLY"), -1)
	if len(runs) == 0 {
		t.Fatal("no -pkg-run 'PKG=^TestKernel' in VM_HOST_ONLY (this test checks them)")
	}
	for _, m := range runs {
		needs := kernelFuncs(t, filepath.Join(root, m[1]))
		if len(needs) == 0 {
			t.Errorf("%s has no kernel test: take its -pkg-run out of VM_HOST_ONLY", m[1])
		}
		for name := range needs {
			if strings.HasPrefix(name, "Test") && !strings.HasPrefix(name, "TestKernel") {
				t.Errorf("%s: %s needs the kernel but is not named TestKernel*: the VM runs only those of this package", m[1], name)
			}
		}
	}
}

// kernelFuncs are the functions of dir's test files that call a kernel
// mark, directly or through other functions of the package.
func kernelFuncs(t *testing.T, dir string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s has no test files", dir)
	}
	fset := token.NewFileSet()
	calls := map[string]map[string]bool{}
	needs := map[string]bool{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		af, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			name := fd.Name.Name
			if fd.Recv != nil {
				name = "(method)." + name
			}
			body := src[fset.Position(fd.Body.Pos()).Offset:fset.Position(fd.Body.End()).Offset]
			if kernelTestMarks.Match(body) {
				needs[name] = true
			}
			called := map[string]bool{}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch c := n.(type) {
				case *ast.Ident:
					called[c.Name] = true
				case *ast.SelectorExpr:
					called["(method)."+c.Sel.Name] = true
				}
				return true
			})
			calls[name] = called
		}
	}
	for changed := true; changed; {
		changed = false
		for name, called := range calls {
			if needs[name] {
				continue
			}
			for c := range called {
				if needs[c] {
					needs[name], changed = true, true
					break
				}
			}
		}
	}
	return needs
}
