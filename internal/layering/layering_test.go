// Package layering holds tests of the import graph: which packages may
// link which. They run `go list`, so they need the go command (on the host
// and in the test VM alike).
package layering

import (
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/ctld/ctld/"

// deps lists what pkg links (go list -deps: its transitive imports, tests
// excluded).
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", module+pkg).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps %s: %v: %s", pkg, err, stderr)
	}
	return strings.Fields(string(out))
}

// The kernel-facing packages and the records they keep (the journal, the
// signed proof) do not link the wire layer: a change of the API's JSON
// must not change the journal's encoding or what a signature covers, and a
// process built from them (a future writer process) must not carry an HTTP
// stack. The guest agent (in every guest) and ctld's client of it speak
// their own framing, not HTTP.
func TestKernelPackagesDoNotLinkTheWireLayer(t *testing.T) {
	for _, pkg := range []string{"internal/rootfs", "internal/netpolicy", "internal/journal", "internal/proof", "internal/errdefs", "internal/names", "internal/agent", "internal/agent/wire", "internal/agent/client", "cmd/ctl-agent"} {
		d := deps(t, pkg)
		if len(d) == 0 {
			t.Fatalf("go list -deps %s listed nothing", pkg)
		}
		for _, bad := range []string{"net/http", module + "internal/api", module + "internal/apiserver"} {
			if slices.Contains(d, bad) {
				t.Errorf("%s links %s", pkg, bad)
			}
		}
	}
}

// The wire types and the client do not link the server: the manager and
// its CLI talk to ctld without carrying its HTTP server.
func TestClientsDoNotLinkTheServer(t *testing.T) {
	for _, pkg := range []string{"internal/api", "internal/manager", "cmd/ctl-manager"} {
		if slices.Contains(deps(t, pkg), module+"internal/apiserver") {
			t.Errorf("%s links internal/apiserver", pkg)
		}
	}
}

// The wire layer sits above the node: internal/api carries the node's
// records (proofs, lease names) through the packages of their own
// (internal/proof, internal/lease, ...), never through internal/node.
func TestAPIDoesNotLinkTheNode(t *testing.T) {
	for _, d := range deps(t, "internal/api") {
		if d == module+"internal/node" || strings.HasPrefix(d, module+"internal/node/") {
			t.Errorf("internal/api links %s", d)
		}
	}
}

// A package under internal/node is a part the node orchestrates: it never
// reaches back up into internal/node.
func TestNodePartsDoNotLinkTheNode(t *testing.T) {
	out, err := exec.Command("go", "list", module+"internal/node/...").Output()
	if err != nil {
		t.Fatalf("go list internal/node/...: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == module+"internal/node" {
			continue
		}
		if slices.Contains(deps(t, strings.TrimPrefix(pkg, module)), module+"internal/node") {
			t.Errorf("%s links internal/node", pkg)
		}
	}
}

// The node and its parts work on domain types: the wire types and the
// server stay at the edge (apiserver's adapter converts), so no package
// under internal/node, the node included, links internal/api or
// internal/apiserver.
func TestNodeDoesNotLinkTheWireLayer(t *testing.T) {
	out, err := exec.Command("go", "list", module+"internal/node/...").Output()
	if err != nil {
		t.Fatalf("go list internal/node/...: %v", err)
	}
	pkgs := strings.Fields(string(out))
	if !slices.Contains(pkgs, module+"internal/node") {
		t.Fatalf("go list internal/node/... did not list the node: %q", pkgs)
	}
	for _, pkg := range pkgs {
		d := deps(t, strings.TrimPrefix(pkg, module))
		for _, bad := range []string{module + "internal/api", module + "internal/apiserver"} {
			if slices.Contains(d, bad) {
				t.Errorf("%s links %s", pkg, bad)
			}
		}
	}
}

// The crash and stall points tests arm through CTLD_TEST_* variables exist
// only in a test build (-tags ctldtest): no source file the shipped ctld is
// built from reads them, so no environment can make it kill itself. The
// test build must have them (else this check proves nothing).
func TestShippedCtldHasNoTestHooks(t *testing.T) {
	if got := filesMentioning(t, "cmd/ctld", "", "CTLD_TEST_"); len(got) > 0 {
		t.Errorf("the shipped build of cmd/ctld reads test hooks in %v", got)
	}
	if got := filesMentioning(t, "cmd/ctld", "ctldtest", "CTLD_TEST_"); len(got) == 0 {
		t.Error("the ctldtest build of cmd/ctld has no CTLD_TEST_ hook: the check above looks in the wrong place")
	}
}

// filesMentioning lists the Go files (cgo ones too) of pkg and of all it
// links that mention s, as the go command selects them with these build
// tags.
func filesMentioning(t *testing.T, pkg, tags, s string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-tags", tags, "-f",
		`{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .CgoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}`,
		module+pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps -tags %q %s: %v", tags, pkg, err)
	}
	var hits []string
	for _, f := range strings.Fields(string(out)) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), s) {
			hits = append(hits, f)
		}
	}
	return hits
}

// The shipped commands link no test helper (and so not package testing):
// not ktest or testutil, nor any of the module's packages named *test (the
// contract suites, nbdtest, pgtest, ...).
func TestCommandsLinkNoTestHelpers(t *testing.T) {
	for _, pkg := range []string{"cmd/ctld", "cmd/ctl-manager", "cmd/ctl-agent"} {
		for _, d := range deps(t, pkg) {
			own, ok := strings.CutPrefix(d, module)
			if d == "testing" || ok && (own == "internal/testutil" || strings.HasSuffix(path.Base(own), "test")) {
				t.Errorf("%s links %s", pkg, d)
			}
		}
	}
}
