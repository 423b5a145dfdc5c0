package main

import (
	"regexp"
	"strings"
	"testing"
)

// A stream as `go test -json` writes it: a passing test, a kernel test's
// skip on the host (allowed), a skip for a missing tool (not allowed), a
// failing test, and the package lines.
const stream = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestOK"}
{"Action":"output","Package":"p","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"p","Test":"TestOK","Output":"--- PASS: TestOK (0.00s)\n"}
{"Action":"pass","Package":"p","Test":"TestOK"}
{"Action":"run","Package":"p","Test":"TestKernelX"}
{"Action":"output","Package":"p","Test":"TestKernelX","Output":"    x_test.go:9: kernel test: needs root in the test VM; run make test-vm\n"}
{"Action":"output","Package":"p","Test":"TestKernelX","Output":"--- SKIP: TestKernelX (0.00s)\n"}
{"Action":"skip","Package":"p","Test":"TestKernelX"}
{"Action":"run","Package":"p","Test":"TestStrace"}
{"Action":"output","Package":"p","Test":"TestStrace","Output":"    s_test.go:31: no strace on this host\n"}
{"Action":"output","Package":"p","Test":"TestStrace","Output":"--- SKIP: TestStrace (0.00s)\n"}
{"Action":"skip","Package":"p","Test":"TestStrace"}
{"Action":"run","Package":"p","Test":"TestBad"}
{"Action":"output","Package":"p","Test":"TestBad","Output":"    b_test.go:5: got 1, want 2\n"}
{"Action":"output","Package":"p","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestBad"}
{"Action":"output","Package":"p","Output":"FAIL\n"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t0.01s\n"}
{"Action":"fail","Package":"p"}
{"Action":"output","Package":"q","Output":"?   \tq\t[no test files]\n"}
{"Action":"skip","Package":"q"}
`

func TestCheck(t *testing.T) {
	var out strings.Builder
	r, err := check(strings.NewReader(stream), &out, regexp.MustCompile("kernel test: needs root in the test VM"))
	if err != nil {
		t.Fatal(err)
	}
	if r.passed != 1 || r.allowedSkips != 1 || len(r.failed) != 1 || len(r.skipped) != 1 || len(r.failedPkgs) != 1 {
		t.Errorf("result %+v", r)
	}
	want := "--- unexpected SKIP: p TestStrace\n    s_test.go:31: no strace on this host\n--- SKIP: TestStrace (0.00s)\n" +
		"    b_test.go:5: got 1, want 2\n--- FAIL: TestBad (0.00s)\nFAIL\tp\t0.01s\n?   \tq\t[no test files]\n"
	if out.String() != want {
		t.Errorf("printed\n%s\nwant\n%s", out.String(), want)
	}
	var sum strings.Builder
	if summary(&sum, r) {
		t.Error("summary passed a run with a failure and an unexpected skip")
	}
	if !strings.Contains(sum.String(), "SKIP (not allowed) p TestStrace: s_test.go:31: no strace on this host") {
		t.Errorf("summary:\n%s", sum.String())
	}
	// Only the allowed skip: passes.
	var quiet strings.Builder
	r, _ = check(strings.NewReader(strings.Join(strings.Split(stream, "\n")[:9], "\n")), &quiet, regexp.MustCompile("needs root in the test VM"))
	if !summary(&quiet, r) {
		t.Errorf("a run with only the kernel tests' skip failed:\n%s", quiet.String())
	}
}
