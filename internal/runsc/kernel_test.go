package runsc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/template"
	"github.com/ctld/ctld/internal/testutil"
)

// helperEnv switches the test binary into helper mode (see TestMain): it
// creates and starts a container, then exits, so the parent can check the
// guest outlives the process that created it.
const helperEnv = "CTLD_RUNTIME_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "create-start":
		os.Exit(helperCreateStart())
	case "stdio-descriptions":
		os.Exit(helperStdioDescriptions())
	case "sleep":
		// A process that looks like runsc by its command line (dead_test.go).
		time.Sleep(time.Hour)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func helperCreateStart() int {
	r := &Runtime{Root: os.Getenv("HELPER_ROOT"), LogDir: os.Getenv("HELPER_LOGDIR"), Version: os.Getenv("HELPER_VERSION")}
	id, bundle := os.Getenv("HELPER_ID"), os.Getenv("HELPER_BUNDLE")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := r.Create(ctx, id, bundle); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := r.Start(ctx, id); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("started", id)
	return 0
}

// newLease makes a cgroup the way ctld's lease does: a pre-created
// directory with limits written, which runsc must join and leave alone.
func newLease(t testing.TB, name string) string {
	t.Helper()
	dir := ktest.MakeCgroup(t, name)
	for f, v := range map[string]string{"cpu.max": "100000 100000", "memory.max": "536870912", "memory.swap.max": "0", "pids.max": "256"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil {
			t.Fatalf("write %s: %v", f, err)
		}
	}
	return "/" + name
}

// runscVersion is the build on PATH (`make RUNSC=current|debian`), which
// the runtime records per container as ctld's wiring does.
func runscVersion(t testing.TB) string {
	t.Helper()
	v, err := Version(context.Background(), "runsc")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("runsc %s", v)
	return v
}

type kernelEnv struct {
	r          *Runtime
	rootfs     string
	bundle     string
	netnsPath  string
	leaseDir   string
	cgroupPath string
}

func setupKernel(t testing.TB, name string) kernelEnv {
	t.Helper()
	ktest.RequireBinary(t, "runsc")
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	tmp := t.TempDir()
	runscRoot := filepath.Join(tmp, "runsc")
	ktest.CheckLeaks(t, ktest.SnapshotOptions{RunscRoots: []string{runscRoot}})

	e := kernelEnv{
		r:      &Runtime{Root: runscRoot, LogDir: filepath.Join(tmp, "logs"), Version: runscVersion(t)},
		rootfs: filepath.Join(tmp, "rootfs"),
		bundle: filepath.Join(tmp, "bundle"),
	}
	if err := template.BuildBusybox(e.rootfs, "/bin/busybox"); err != nil {
		t.Fatal(err)
	}
	e.netnsPath = ktest.NewNetns(t).Path
	e.cgroupPath = newLease(t, fmt.Sprintf("ctld-rt-%s-%d", name, os.Getpid()))
	e.leaseDir = filepath.Join(ktest.CgroupRoot, e.cgroupPath)
	s, err := BuildSpec(BundleSpec{
		ContainerID: name, RootPath: e.rootfs, Hostname: name,
		NetnsPath: e.netnsPath, CgroupsPath: e.cgroupPath,
		CPUMillis: 1000, MemoryBytes: 512 << 20, PIDs: 256,
		Args: []string{"sleep", "1000"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteBundle(e.bundle, s); err != nil {
		t.Fatal(err)
	}
	// Registered after the netns and lease, so it runs before their removal.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.r.Delete(ctx, name); err != nil {
			t.Errorf("cleanup delete: %v", err)
		}
		if t.Failed() {
			for _, f := range []string{e.r.logFile(name), e.r.InitLogFile(name)} {
				b, _ := os.ReadFile(f)
				t.Logf("%s:\n%s", f, b)
			}
		}
	})
	return e
}

func execOut(t *testing.T, r *Runtime, id string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	code, err := r.Exec(ctx, id, ExecProcess{Args: args}, nil, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q: %v (stderr %q)", args, err, errb.String())
	}
	return out.String() + errb.String(), code
}

func TestRunscLifecycle(t *testing.T) {
	const id = "rt-life"
	e := setupKernel(t, id)
	r := e.r
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	v, err := Version(ctx, "runsc")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("runsc %s", v)
	t0 := time.Now()
	if err := r.Create(ctx, id, e.bundle); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	t.Logf("create+start took %v", time.Since(t0))

	st, err := r.State(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != "running" || st.Pid <= 0 || st.ID != id {
		t.Fatalf("state = %+v, want running with a pid", st)
	}
	if known, err := r.Known(); err != nil || !slices.Contains(known, id) {
		t.Fatalf("Known = %v, %v; want it to contain %s", known, err, id)
	}
	// The sandbox joined the pre-created lease, and the lease kept its limits.
	procs, err := os.ReadFile(filepath.Join(e.leaseDir, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains("\n"+string(procs), fmt.Sprintf("\n%d\n", st.Pid)) {
		t.Errorf("sandbox pid %d not in lease cgroup.procs %q", st.Pid, procs)
	}
	if b, _ := os.ReadFile(filepath.Join(e.leaseDir, "pids.max")); strings.TrimSpace(string(b)) != "256" {
		t.Errorf("lease pids.max = %q, runsc changed it", b)
	}

	if out, code := execOut(t, r, id, "echo", "hello"); out != "hello\n" || code != 0 {
		t.Errorf("echo hello: %q code %d", out, code)
	}
	if out, code := execOut(t, r, id, "sh", "-c", "exit 3"); code != 3 {
		t.Errorf("exit 3: code %d, output %q", code, out)
	}
	if out, _ := execOut(t, r, id, "hostname"); out != id+"\n" {
		t.Errorf("hostname = %q", out)
	}
	// Cancelling an exec kills the guest process, not only runsc exec.
	cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
	var sink bytes.Buffer
	if _, err := r.Exec(cctx, id, ExecProcess{Args: []string{"sleep", "777"}}, nil, &sink, &sink); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled exec: %v, want deadline exceeded", err)
	}
	ccancel()
	if out, _ := execOut(t, r, id, "ps"); strings.Contains(out, "sleep 777") {
		t.Errorf("cancelled exec left its process: %q", out)
	}
	if ids, err := r.List(ctx); err != nil || len(ids) != 1 || ids[0] != id {
		t.Errorf("list = %q, %v", ids, err)
	}
	if ok, detail := r.CheckGone(ctx, id); ok {
		t.Errorf("CheckGone true for a running container: %s", detail)
	}

	if err := r.Kill(ctx, id, syscall.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(ctx, id); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := r.State(ctx, id); !errors.Is(err, ErrNotExist) {
		t.Errorf("state after delete: %v, want ErrNotExist", err)
	}
	if ok, detail := waitGone(ctx, r, id); !ok {
		t.Errorf("CheckGone: %s", detail)
	}
	if ids, err := r.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("list after delete = %q, %v", ids, err)
	}
}

// waitGone polls CheckGone briefly: the sandbox and gofer may take a moment
// to be reaped after delete returned.
func waitGone(ctx context.Context, r *Runtime, id string) (bool, string) {
	return testutil.Eventually(5*time.Second, func() (bool, string) { return r.CheckGone(ctx, id) })
}

// TestRunscGuestOutlivesCreator creates and starts the container from a
// child process that then exits, as a crashed primary would, and checks the
// guest still runs and accepts exec from a new process.
func TestRunscGuestOutlivesCreator(t *testing.T) {
	const id = "rt-orphan"
	e := setupKernel(t, id)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=create-start",
		"HELPER_ROOT="+e.r.Root, "HELPER_VERSION="+e.r.Version, "HELPER_LOGDIR="+e.r.LogDir, "HELPER_ID="+id, "HELPER_BUNDLE="+e.bundle)
	// If the sandbox inherited the helper's stdout pipe, Output would wait
	// for the guest to die; WaitDelay turns that into an error.
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("helper: %v, stdout %q, stderr %q", err, out, stderr)
	}
	if string(out) != "started "+id+"\n" {
		t.Fatalf("helper said %q", out)
	}
	// The creator is gone (Output reaped it); the guest must not be.
	st, err := e.r.State(ctx, id)
	if err != nil || st.Status != "running" {
		t.Fatalf("state after creator exit = %+v, %v", st, err)
	}
	if out, code := execOut(t, e.r, id, "echo", "still-here"); out != "still-here\n" || code != 0 {
		t.Errorf("exec after creator exit: %q code %d", out, code)
	}
	if out, _ := execOut(t, e.r, id, "ps"); !strings.Contains(out, "sleep 1000") {
		t.Errorf("init process gone: ps = %q", out)
	}
	if err := e.r.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if ok, detail := waitGone(ctx, e.r, id); !ok {
		t.Errorf("CheckGone: %s", detail)
	}
}
