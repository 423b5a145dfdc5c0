package agent_test

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ctld/ctld/internal/agent"
	"github.com/ctld/ctld/internal/agent/client"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/runsc"
	"github.com/ctld/ctld/internal/template"
)

// agentBinary is the static ctl-agent the VM harness builds
// ($CTLD_BIN_DIR/ctl-agent); a dynamic one would not start in an image
// without a libc.
func agentBinary(t testing.TB) string {
	t.Helper()
	p := ktest.RequireBuilt(t, "ctl-agent")
	f, err := elf.Open(p)
	if err != nil {
		t.Fatalf("ctl-agent binary: %v", err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Fatalf("%s is dynamically linked: build it with CGO_ENABLED=0 (make agent)", p)
		}
	}
	return p
}

func vmLease(t testing.TB, name string) string {
	t.Helper()
	ktest.MakeCgroup(t, name)
	return "/" + name
}

// guest is a runsc container whose init is ctl-agent (busybox root,
// workload `sleep` as uid 1000), its socket reachable from the host
// through a bind-mounted directory and --host-uds=create.
type guest struct {
	id      string
	r       *runsc.Runtime
	c       *client.Client
	created time.Time // when `runsc create` was called
	started time.Time // when `runsc start` returned
	cgroup  string    // the guest's cgroup directory (VM runs only)
	cpu0    time.Duration
}

// cpu is the CPU time the guest's cgroup used so far (sentry, gofer and
// their threads): what a guest's start costs, less sensitive than wall
// time to what else the machine runs. 0 where there is no cgroup.
func (g *guest) cpu(t testing.TB) time.Duration {
	t.Helper()
	if g.cgroup == "" {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(g.cgroup, "cpu.stat"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("cpu.stat: %q: %v", l, err)
			}
			return time.Duration(n) * time.Microsecond
		}
	}
	t.Fatalf("cpu.stat without usage_usec: %q", b)
	return 0
}

// guestOpts: host is a run on a machine that is not the test VM (no
// cgroup v2, no netns for runsc): --network=none and --ignore-cgroups.
type guestOpts struct {
	id, nonce, bin string
	host           bool
	env            []string // more of the agent's environment
	noWorkload     bool     // the agent alone, no workload after "--"
	warm           bool     // a warm pool member's agent (--warm): a claim call names the workload
	memory         int64    // the guest's memory limit in the VM (0: 512 MiB)
}

func startGuest(t testing.TB, o guestOpts) *guest {
	t.Helper()
	tmp := t.TempDir()
	runscRoot := filepath.Join(tmp, "runsc")
	if !o.host {
		ktest.CheckLeaks(t, ktest.SnapshotOptions{RunscRoots: []string{runscRoot}})
	}
	rootfs := filepath.Join(tmp, "rootfs")
	if err := template.BuildBusybox(rootfs, "/bin/busybox"); err != nil {
		t.Fatal(err)
	}
	// Mount points, and the host side: the binary read-only, the socket
	// directory read-write.
	for _, d := range []string{".ctl", ".ctl-bin"} {
		if err := os.Mkdir(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	binDir, sockDir := filepath.Join(tmp, "agent-bin"), filepath.Join(tmp, "agent-sock")
	for _, d := range []string{binDir, sockDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(o.bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(binDir, "ctl-agent"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	bs := runsc.BundleSpec{
		ContainerID: o.id, RootPath: rootfs, Hostname: o.id, NetnsPath: "/proc/self/ns/net",
		Args: runsc.AgentArgs([]string{"sleep", "100000"}),
		Env:  []string{agent.EnvUID + "=1000", agent.EnvGID + "=1000"},
	}
	if o.noWorkload {
		bs.Args = runsc.AgentArgs(nil)
	}
	if o.warm {
		bs.Args = runsc.WarmAgentArgs()
	}
	// The nonce as ctld leaves it: a root-only file the agent removes.
	if err := os.WriteFile(filepath.Join(sockDir, runsc.AgentNonce), []byte(o.nonce), 0o400); err != nil {
		t.Fatal(err)
	}
	bs.Env = append(bs.Env, o.env...)
	if !o.host {
		bs.NetnsPath = ktest.NewNetns(t).Path
		bs.CgroupsPath = vmLease(t, fmt.Sprintf("ctld-%s-%d", o.id, os.Getpid()))
		bs.CPUMillis, bs.MemoryBytes, bs.PIDs = 1000, 512<<20, 256
		if o.memory > 0 {
			bs.MemoryBytes = o.memory
		}
	}
	s, err := runsc.BuildSpec(bs)
	if err != nil {
		t.Fatal(err)
	}
	if o.warm {
		// As runsc.Agent.Warm gives a member: for the claim's hostname.
		c := s.Process.Capabilities
		c.Bounding = append(c.Bounding, runsc.WarmCapability)
		c.Effective = append(c.Effective, runsc.WarmCapability)
		c.Permitted = append(c.Permitted, runsc.WarmCapability)
	}
	if o.host {
		// --network=none: no netns to join.
		var ns []specs.LinuxNamespace
		for _, n := range s.Linux.Namespaces {
			if n.Type != specs.NetworkNamespace {
				ns = append(ns, n)
			}
		}
		s.Linux.Namespaces = ns
	}
	s.Mounts = append(s.Mounts,
		specs.Mount{Destination: "/.ctl-bin", Type: "bind", Source: binDir, Options: []string{"rbind", "ro"}},
		specs.Mount{Destination: "/.ctl", Type: "bind", Source: sockDir, Options: []string{"rbind", "rw"}},
	)
	bundle := filepath.Join(tmp, "bundle")
	if err := runsc.WriteBundle(bundle, s); err != nil {
		t.Fatal(err)
	}
	r := &runsc.Runtime{Root: runscRoot, LogDir: filepath.Join(tmp, "logs"), HostUDS: "create"}
	// The build on PATH, as ctld records it (make RUNSC=current|debian).
	r.Version, _ = runsc.Version(context.Background(), "runsc")
	if o.host {
		r.Network, r.IgnoreCgroups = "none", true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	created := time.Now()
	if err := r.Create(ctx, o.id, bundle); err != nil {
		t.Fatal(err)
	}
	g := &guest{id: o.id, r: r, c: &client.Client{Socket: filepath.Join(sockDir, "agent.sock")}, created: created}
	if bs.CgroupsPath != "" {
		g.cgroup = filepath.Join(ktest.CgroupRoot, bs.CgroupsPath)
	}
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		// A bench deletes its guests as it goes: gone is fine.
		if err := r.Delete(dctx, o.id); err != nil && !errors.Is(err, runsc.ErrNotExist) {
			t.Errorf("delete: %v", err)
		}
		if t.Failed() {
			for _, f := range []string{r.InitLogFile(o.id), filepath.Join(r.ContainerLogDir(o.id), "runsc.log")} {
				b, _ := os.ReadFile(f)
				if len(b) > 8000 {
					b = b[len(b)-8000:]
				}
				t.Logf("%s:\n%s", f, b)
			}
		}
	})
	if err := r.Start(ctx, o.id); err != nil {
		t.Fatal(err)
	}
	g.started = time.Now()
	g.cpu0 = g.cpu(t)
	return g
}

// waitReady polls the agent until it answers, and returns its nonce.
func (g *guest) waitReady(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		got, err := g.c.Ready(ctx)
		if err == nil {
			return got
		}
		if ctx.Err() != nil {
			t.Fatalf("agent never answered on the host: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hostRunsc says whether this host can run the guest without the VM:
// root and runsc on the PATH.
func hostRunsc() (bool, string) {
	if os.Geteuid() != 0 {
		return false, "not root"
	}
	if _, err := exec.LookPath("runsc"); err != nil {
		return false, "no runsc on the PATH"
	}
	return true, ""
}
