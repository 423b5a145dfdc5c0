package lease

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ctld/ctld/internal/ktest"
)

// TestKernelRunscPrecreatedLease records how runsc treats an OCI
// linux.cgroupsPath that points at a lease ctld already made.
func TestKernelRunscPrecreatedLease(t *testing.T) {
	runsc := ktest.RequireBinary(t, "runsc")
	busybox := ktest.RequireBinary(t, "busybox")
	stateRoot := filepath.Join(t.TempDir(), "runsc")
	// Before kernelManager, so this check runs after the lease cleanup.
	ktest.CheckLeaks(t, ktest.SnapshotOptions{RunscRoots: []string{stateRoot}})
	m := kernelManager(t)
	ctx := t.Context()

	s := Spec{ID: "runsc", CPUMillis: 500, MemoryBytes: 512 << 20, PIDs: 64}
	if err := m.Create(ctx, s); err != nil {
		t.Fatalf("Create: %v", err)
	}

	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	quota, period := int64(200000), uint64(100000)
	memLimit, pidsLimit := int64(256<<20), int64(100)
	spec := specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: "rootfs", Readonly: true},
		Process: &specs.Process{
			Args: []string{"/bin/busybox", "sleep", "600"},
			Cwd:  "/",
			Env:  []string{"PATH=/bin"},
		},
		Linux: &specs.Linux{
			CgroupsPath: m.CgroupsPath(s.ID),
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
			// Different from the lease on purpose: does runsc rewrite them?
			Resources: &specs.LinuxResources{
				CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
				Memory: &specs.LinuxMemory{Limit: &memLimit},
				Pids:   &specs.LinuxPids{Limit: &pidsLimit},
			},
		},
	}
	cfg, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}

	logDir := t.TempDir()
	run := func(args ...string) (string, error) {
		full := append([]string{"--root", stateRoot, "--network=none", "--debug", "--debug-log=" + logDir + "/"}, args...)
		out, err := exec.CommandContext(ctx, runsc, full...).CombinedOutput()
		t.Logf("runsc %s: %v\n%s", strings.Join(args, " "), err, out)
		return string(out), err
	}
	const cid = "lease-probe"
	created := false
	t.Cleanup(func() {
		if created {
			run("delete", "--force", cid)
		}
	})
	if _, err := run("create", "--bundle", bundle, cid); err != nil {
		dumpLogs(t, logDir)
		t.Fatalf("runsc create: %v", err)
	}
	created = true
	dir := m.Dir(s.ID)
	show := func(when string) {
		procs := strings.Fields(readFile(t, filepath.Join(dir, "cgroup.procs")))
		var who []string
		for _, p := range procs {
			comm, _ := os.ReadFile(filepath.Join("/proc", p, "comm"))
			who = append(who, p+":"+strings.TrimSpace(string(comm)))
		}
		t.Logf("%s: lease procs %v; cpu.max=%q memory.max=%q pids.max=%q", when, who,
			readFile(t, filepath.Join(dir, "cpu.max")), readFile(t, filepath.Join(dir, "memory.max")),
			readFile(t, filepath.Join(dir, "pids.max")))
		subs, _ := os.ReadDir(dir)
		for _, e := range subs {
			if e.IsDir() {
				t.Logf("%s: child cgroup %s", when, e.Name())
			}
		}
	}
	show("after create")
	if _, err := run("start", cid); err != nil {
		dumpLogs(t, logDir)
		t.Fatalf("runsc start: %v", err)
	}
	show("after start")
	st, _ := run("state", cid)
	_ = st
	if _, err := run("kill", cid, "KILL"); err != nil {
		t.Errorf("runsc kill: %v", err)
	}
	run("wait", cid)
	if _, err := run("delete", cid); err != nil {
		t.Errorf("runsc delete: %v", err)
	}
	created = false
	if _, err := os.Stat(dir); err == nil {
		show("after delete")
		t.Logf("after delete: lease dir still exists")
	} else {
		t.Logf("after delete: lease dir gone: %v", err)
	}
	dumpLogs(t, logDir)
}

func dumpLogs(t *testing.T, dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		var keep []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(strings.ToLower(l), "cgroup") {
				keep = append(keep, l)
			}
		}
		t.Logf("log %s (cgroup lines):\n%s", e.Name(), strings.Join(keep, "\n"))
	}
}
