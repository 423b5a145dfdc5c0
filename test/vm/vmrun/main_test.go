package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestCountResults(t *testing.T) {
	log := `=== RUN   TestA
--- PASS: TestA (0.00s)
=== RUN   TestB
=== RUN   TestB/sub
    --- SKIP: TestB/sub (0.00s)
--- FAIL: TestB (0.01s)
some output --- PASS: not a result line
PASS`
	got := countResults(log)
	if got != (pkgCount{pass: 1, fail: 1, skip: 1}) {
		t.Fatalf("countResults = %+v, want 1 pass, 1 fail, 1 skip", got)
	}
}

func TestGuestScriptQuotesArguments(t *testing.T) {
	s := guestScript([]Job{{Name: "x", Dir: "/a b", Argv: []string{"/bin/t", "it's"}, Timeout: 5}}, []string{"K=v w"})
	for _, want := range []string{
		`cd '/a b' && timeout -k 10 5 '/bin/t' 'it'\''s'`,
		`export 'K=v w'`,
		"echo $? > /ctld-vm/out/0.rc",
		"mount -t cgroup2 cgroup2 /sys/fs/cgroup",
		"modprobe nbd nbds_max=16",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("guest script lacks %q", want)
		}
	}
}

func TestTroubleMatchesKernelProblemsNotCgroupOOM(t *testing.T) {
	for line, want := range map[string]bool{
		"[ 12.1] Memory cgroup out of memory: Killed process 183 (0-lease.test)": false,
		"[ 12.1] Out of memory: Killed process 183 (x)":                          true,
		"[ 30.0] INFO: task kworker/0:1:12 blocked for more than 120 seconds.":   true,
		"[ 31.0] BUG: kernel NULL pointer dereference, address: 0000":            true,
		"--- PASS: TestX (0.01s)":                                                false,
	} {
		if got := troubleRE.MatchString(line); got != want {
			t.Errorf("troubleRE(%q) = %v, want %v", line, got, want)
		}
	}
}

func TestTestFilter(t *testing.T) {
	const e2e = "github.com/ctld/ctld/test/e2e"
	const node = "github.com/ctld/ctld/internal/node"
	c := config{pkgRun: multiFlag{"./test/e2e=TestA|TestB"}, pkgSkip: multiFlag{"test/e2e=TestA|TestB"}}
	hostOnly := config{pkgSkip: multiFlag{"internal/node=^TestCrashPoints$", "internal/ha=^TestFailoverRandomized$"}}
	for _, tc := range []struct {
		c         config
		pkg       string
		run, skip string
		wantErr   bool
	}{
		{c: c, pkg: e2e, run: "TestA|TestB", skip: "TestA|TestB"},
		{c: c, pkg: node},
		{c: config{run: "TestX"}, pkg: node, run: "TestX"},
		{c: config{pkgSkip: multiFlag{"e2e=TestA"}}, pkg: e2e, skip: "TestA"},
		// "e2e" is not "test/e2e"'s whole last element when written "2e".
		{c: config{pkgSkip: multiFlag{"2e=TestA"}}, pkg: e2e},
		{c: config{run: "TestX", pkgRun: multiFlag{"test/e2e=TestA"}}, pkg: e2e, wantErr: true},
		{c: config{pkgRun: multiFlag{"test/e2e"}}, pkg: e2e, wantErr: true},
		{c: config{pkgSkip: multiFlag{"=TestA"}}, pkg: e2e, wantErr: true},
		// The Makefile's VM_HOST_ONLY: each -pkg-skip names one package, not
		// the packages below it.
		{c: hostOnly, pkg: node, skip: "^TestCrashPoints$"},
		{c: hostOnly, pkg: "github.com/ctld/ctld/internal/ha", skip: "^TestFailoverRandomized$"},
		{c: hostOnly, pkg: node + "/fakekernel"},
	} {
		run, skip, err := testFilter(tc.c, tc.pkg)
		if (err != nil) != tc.wantErr || run != tc.run || skip != tc.skip {
			t.Errorf("testFilter(%+v, %s) = %q, %q, %v; want %q, %q, err %v", tc.c, tc.pkg, run, skip, err, tc.run, tc.skip, tc.wantErr)
		}
	}
}

func TestSlowestTopLevelTests(t *testing.T) {
	log := `=== RUN   TestA
--- PASS: TestA (1.50s)
=== RUN   TestB
    --- PASS: TestB/sub (99.00s)
--- FAIL: TestB (100.25s)
--- SKIP: TestC (0.00s)
--- PASS: TestD (7.00s)
PASS`
	got := slowest(testTimes("pkg/x", log), 2)
	want := []testTime{{"pkg/x", "TestB", 100.25}, {"pkg/x", "TestD", 7}}
	if !slices.Equal(got, want) {
		t.Fatalf("slowest = %v, want %v (subtests are not counted on their own)", got, want)
	}
	if all := testTimes("pkg/x", log); len(all) != 4 {
		t.Fatalf("testTimes found %d top-level tests, want 4: %v", len(all), all)
	}
}

// Binaries run from the guest's tmpfs, not from the results share (9p
// without a page cache, read again at every exec): the commands are copied
// once, each test binary just before its job and removed after it.
func TestGuestScriptRunsBinariesFromTmpfs(t *testing.T) {
	s := guestScript([]Job{{Name: "p", Dir: "/d", Argv: []string{"/ctld-bin/0-p.test", "-test.v"}, Timeout: 5, Stage: "/ctld-vm/bin/0-p.test"}}, nil)
	for _, want := range []string{
		"mount -t tmpfs -o mode=755 tmpfs /ctld-bin\n",
		"cp -a /ctld-vm/bin/cmd /ctld-bin/cmd",
		`(cp '/ctld-vm/bin/0-p.test' '/ctld-bin/0-p.test' && cd '/d' && timeout -k 10 5 '/ctld-bin/0-p.test' '-test.v'; echo $? > /ctld-vm/out/0.rc)`,
		"rm -f '/ctld-bin/0-p.test'\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("guest script lacks %q:\n%s", want, s)
		}
	}
	if i, j := strings.Index(s, "cp -a /ctld-vm/bin/cmd"), strings.Index(s, "=== vm job 0"); i < 0 || i > j {
		t.Errorf("the commands are not copied before the first job")
	}
}

// TestBenchProblems: a bench job fails when a benchmark skipped.
func TestBenchProblems(t *testing.T) {
	ok := "goos: linux\nBenchmarkQuery\nBenchmarkQuery/proxy-2   \t       1\t   1064303 ns/op\t 940.0 queries/s\nPASS\n"
	if p := benchProblems("p", ok); len(p) != 0 {
		t.Errorf("a benchmark that ran: %v", p)
	}
	if ran, _ := benchCount(ok); ran != 1 {
		t.Errorf("ran = %d, want 1", ran)
	}
	partly := ok + "--- SKIP: BenchmarkB\n    b_test.go:41: host run needs runsc\n"
	if p := benchProblems("p", partly); len(p) != 1 || !strings.Contains(p[0], "1 benchmark(s) skipped") {
		t.Errorf("one ran, one skipped: %v", p)
	}
}

// TestReportFailsBenchThatMeasuredNothing: the run's report fails a bench
// run whose binaries exited 0 when no benchmark matched in any package, or
// one skipped; a package without a match beside one that ran is fine.
func TestReportFailsBenchThatMeasuredNothing(t *testing.T) {
	const ran, none = "BenchmarkA-2 \t 1\t 5 ns/op\nPASS\n", "PASS\n"
	for name, logs := range map[string][]string{
		"none matched":        {none, none},
		"skipped":             {ran, "BenchmarkA\n--- SKIP: BenchmarkA\n    a_test.go:41: host run needs runsc\nPASS\n"},
		"ran":                 {ran},
		"ran, other no match": {ran, none},
	} {
		share := t.TempDir()
		if err := os.MkdirAll(filepath.Join(share, "out"), 0o755); err != nil {
			t.Fatal(err)
		}
		files := map[string]string{"done": ""}
		var jobs []Job
		for i, log := range logs {
			files[fmt.Sprintf("out/%d.rc", i)], files[fmt.Sprintf("out/%d.log", i)] = "0\n", log
			jobs = append(jobs, Job{Name: fmt.Sprintf("./p%d", i), IsBench: true})
		}
		for f, b := range files {
			if err := os.WriteFile(filepath.Join(share, f), []byte(b), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		err := report(jobs, share, bootResult{})
		if (err == nil) != strings.HasPrefix(name, "ran") {
			t.Errorf("%s: report = %v", name, err)
		}
	}
}

// The VM's tests get ctld's crash points (-tags ctldtest); the systemd
// scenario runs the binary as it ships.
func TestCmdBuildTagsOnlyTestRuns(t *testing.T) {
	if got := strings.Join(cmdBuildArgs(false, "o/"), " "); got != "build -tags ctldtest -o o/ ./cmd/..." {
		t.Errorf("test build: go %s", got)
	}
	if got := strings.Join(cmdBuildArgs(true, "o/"), " "); got != "build -o o/ ./cmd/..." {
		t.Errorf("systemd build: go %s", got)
	}
}

// TestReapKillsLeftovers runs vm_reap as PID 1 of its own PID, network and
// mount namespaces (so its kills and flushes reach nothing of the host's)
// with a leftover child and a named netns, as a job killed at its timeout
// leaves them.
func TestReapKillsLeftovers(t *testing.T) {
	script := reapFunc + `
mount -t tmpfs tmpfs /run && mkdir /run/netns || exit 3
ip netns add vmreap-test || exit 3
sleep 30 &
child=$!
vm_reap 7
wait "$child"
echo "child status $?"
[ -e /run/netns/vmreap-test ] && echo "netns kept" || echo "netns gone"
vm_reap 8
echo "second reap done"
`
	out, err := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "--net", "--mount", "sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("vm_reap in its own namespaces (needs root): %v\n%s", err, out)
	}
	got := string(out)
	for _, want := range []string{
		"vm: job 7 left process ",
		"(/usr/bin/sleep): killed",
		"vm: job 7 left 1 processes",
		"child status 137",
		"netns gone",
		"second reap done",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("vm_reap output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "job 8 left") {
		t.Errorf("the second reap found leftovers after the first killed them:\n%s", got)
	}
}
