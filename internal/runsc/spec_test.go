package runsc

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func goodBundle() BundleSpec {
	return BundleSpec{
		ContainerID: "sbx-1.g2",
		RootPath:    "/run/ctld/roots/sbx-1",
		Hostname:    "sbx-1",
		NetnsPath:   "/run/netns/sbx-1",
		CgroupsPath: "/ctld.slice/lease-7",
		CPUMillis:   1500,
		MemoryBytes: 512 << 20,
		PIDs:        128,
		Args:        []string{"sleep", "1000"},
		Env:         []string{"A=b"},
		OOMScoreAdj: 300,
	}
}

func TestBuildSpec(t *testing.T) {
	s, err := BuildSpec(goodBundle())
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != "1.0.2" || s.Hostname != "sbx-1" {
		t.Errorf("version %q hostname %q", s.Version, s.Hostname)
	}
	if s.Root.Path != "/run/ctld/roots/sbx-1" || s.Root.Readonly {
		t.Errorf("root = %+v", s.Root)
	}
	p := s.Process
	if !slices.Equal(p.Args, []string{"sleep", "1000"}) || p.Cwd != "/" || p.User.UID != 0 || p.User.GID != 0 || p.Terminal {
		t.Errorf("process = %+v", p)
	}
	if !slices.Equal(p.Env, []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "A=b"}) {
		t.Errorf("env = %q", p.Env)
	}
	if !p.NoNewPrivileges {
		t.Error("no_new_privileges not set")
	}
	if p.OOMScoreAdj == nil || *p.OOMScoreAdj != 300 {
		t.Errorf("oomScoreAdj = %v, want 300", p.OOMScoreAdj)
	}
	// Zero is written too: absent, runsc leaves ctld's own value.
	zero := goodBundle()
	zero.OOMScoreAdj = 0
	if z, err := BuildSpec(zero); err != nil || z.Process.OOMScoreAdj == nil || *z.Process.OOMScoreAdj != 0 {
		t.Errorf("oomScoreAdj 0 not written explicitly: %v", err)
	}
	wantCaps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT"}
	c := p.Capabilities
	for name, got := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted} {
		if !slices.Equal(got, wantCaps) {
			t.Errorf("%s caps = %q, want %q", name, got, wantCaps)
		}
	}
	if len(c.Inheritable) != 0 || len(c.Ambient) != 0 {
		t.Errorf("inheritable %q ambient %q, want none", c.Inheritable, c.Ambient)
	}
	wantRlimits := []specs.POSIXRlimit{
		{Type: "RLIMIT_NOFILE", Hard: 65536, Soft: 65536},
		{Type: "RLIMIT_NPROC", Hard: 128, Soft: 128},
	}
	if !slices.Equal(p.Rlimits, wantRlimits) {
		t.Errorf("rlimits = %+v", p.Rlimits)
	}

	l := s.Linux
	wantNS := []specs.LinuxNamespace{
		{Type: specs.PIDNamespace},
		{Type: specs.IPCNamespace},
		{Type: specs.UTSNamespace},
		{Type: specs.MountNamespace},
		{Type: specs.NetworkNamespace, Path: "/run/netns/sbx-1"},
	}
	if !slices.Equal(l.Namespaces, wantNS) {
		t.Errorf("namespaces = %+v", l.Namespaces)
	}
	if l.CgroupsPath != "/ctld.slice/lease-7" {
		t.Errorf("cgroupsPath = %q", l.CgroupsPath)
	}
	for _, m := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware", "/proc/sched_debug"} {
		if !slices.Contains(l.MaskedPaths, m) {
			t.Errorf("masked paths %q lack %s", l.MaskedPaths, m)
		}
	}
	if !slices.Equal(l.ReadonlyPaths, []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}) {
		t.Errorf("readonly paths = %q", l.ReadonlyPaths)
	}

	r := l.Resources
	if r.CPU == nil || *r.CPU.Quota != 150000 || *r.CPU.Period != 100000 || *r.CPU.Shares != 1536 {
		t.Errorf("cpu = %+v", r.CPU)
	}
	if r.Memory == nil || *r.Memory.Limit != 512<<20 || *r.Memory.Swap != 512<<20 {
		t.Errorf("memory = %+v", r.Memory)
	}
	if r.Pids == nil || *r.Pids.Limit != 128 {
		t.Errorf("pids = %+v", r.Pids)
	}

	var dests []string
	for _, m := range s.Mounts {
		dests = append(dests, m.Destination)
	}
	if !slices.Equal(dests, []string{"/proc", "/dev", "/dev/pts", "/dev/shm", "/sys"}) {
		t.Errorf("mounts = %q", dests)
	}
}

func TestBuildSpecVariants(t *testing.T) {
	b := goodBundle()
	b.UID, b.GID = 1000, 1000
	b.CPUMillis, b.MemoryBytes, b.PIDs = 0, 0, 0
	b.ReadonlyRoot = true
	b.Cwd = "/tmp"
	b.Env = []string{"PATH=/bin"}
	s, err := BuildSpec(b)
	if err != nil {
		t.Fatal(err)
	}
	c := s.Process.Capabilities
	if len(c.Bounding) == 0 || len(c.Effective) != 0 || len(c.Permitted) != 0 {
		t.Errorf("non-root caps = %+v: want bounding only", c)
	}
	if !slices.Equal(s.Process.Env, []string{"PATH=/bin"}) || s.Process.Cwd != "/tmp" {
		t.Errorf("env %q cwd %q", s.Process.Env, s.Process.Cwd)
	}
	if r := s.Linux.Resources; r.CPU != nil || r.Memory != nil || r.Pids != nil {
		t.Errorf("zero resources should be unlimited: %+v", r)
	}
	if !s.Root.Readonly || s.Mounts[len(s.Mounts)-1].Destination != "/tmp" {
		t.Errorf("read-only root needs a /tmp tmpfs: root %+v mounts %+v", s.Root, s.Mounts)
	}
	if s.Process.Rlimits[1].Hard != 65536 {
		t.Errorf("NPROC without a PIDs limit = %d", s.Process.Rlimits[1].Hard)
	}
	// Small CPU shares never fall below the kernel minimum of 2.
	b.CPUMillis = 10
	s, err = BuildSpec(b)
	if err != nil {
		t.Fatal(err)
	}
	if *s.Linux.Resources.CPU.Shares != 10 || *s.Linux.Resources.CPU.Quota != 1000 {
		t.Errorf("10m cpu = shares %d quota %d", *s.Linux.Resources.CPU.Shares, *s.Linux.Resources.CPU.Quota)
	}
}

func TestBuildSpecBadInput(t *testing.T) {
	for name, mut := range map[string]func(*BundleSpec){
		"empty id":         func(b *BundleSpec) { b.ContainerID = "" },
		"id with slash":    func(b *BundleSpec) { b.ContainerID = "a/b" },
		"id dotdot":        func(b *BundleSpec) { b.ContainerID = ".." },
		"id leading dash":  func(b *BundleSpec) { b.ContainerID = "-rf" },
		"id too long":      func(b *BundleSpec) { b.ContainerID = strings.Repeat("a", 129) },
		"relative root":    func(b *BundleSpec) { b.RootPath = "roots/x" },
		"unclean root":     func(b *BundleSpec) { b.RootPath = "/run/../etc" },
		"no netns":         func(b *BundleSpec) { b.NetnsPath = "" },
		"relative netns":   func(b *BundleSpec) { b.NetnsPath = "netns/x" },
		"cgroup escape":    func(b *BundleSpec) { b.CgroupsPath = "/ctld.slice/../../x" },
		"cgroup relative":  func(b *BundleSpec) { b.CgroupsPath = "ctld.slice/x" },
		"cgroup root":      func(b *BundleSpec) { b.CgroupsPath = "/" },
		"negative cpu":     func(b *BundleSpec) { b.CPUMillis = -1 },
		"tiny cpu":         func(b *BundleSpec) { b.CPUMillis = 5 },
		"negative memory":  func(b *BundleSpec) { b.MemoryBytes = -1 },
		"negative pids":    func(b *BundleSpec) { b.PIDs = -5 },
		"no args":          func(b *BundleSpec) { b.Args = nil },
		"empty arg0":       func(b *BundleSpec) { b.Args = []string{""} },
		"env without =":    func(b *BundleSpec) { b.Env = []string{"FOO"} },
		"env empty key":    func(b *BundleSpec) { b.Env = []string{"=x"} },
		"relative cwd":     func(b *BundleSpec) { b.Cwd = "tmp" },
		"hostname slash":   func(b *BundleSpec) { b.Hostname = "a/b" },
		"hostname too big": func(b *BundleSpec) { b.Hostname = strings.Repeat("h", 65) },
		"protective oom":   func(b *BundleSpec) { b.OOMScoreAdj = -900 },
		"oom above max":    func(b *BundleSpec) { b.OOMScoreAdj = 1001 },
	} {
		b := goodBundle()
		mut(&b)
		if s, err := BuildSpec(b); err == nil {
			t.Errorf("%s: accepted, spec %+v", name, s)
		}
	}
}

func TestWriteBundle(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bundle")
	s, err := BuildSpec(goodBundle())
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // replacing an existing config works the same
		if err := WriteBundle(dir, s); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got specs.Spec
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Linux.Namespaces[4].Path != "/run/netns/sbx-1" || got.Linux.CgroupsPath != "/ctld.slice/lease-7" || !got.Process.NoNewPrivileges {
		t.Errorf("round trip lost fields: %s", b)
	}
	// The guest's env is in there: root only.
	if fi, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		t.Error(err)
	} else if fi.Mode().Perm() != 0o600 {
		t.Errorf("config.json mode %v, want 0600", fi.Mode())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("bundle dir holds %d entries, want only config.json", len(ents))
	}
}
