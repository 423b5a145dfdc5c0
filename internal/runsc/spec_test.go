package runsc

import (
	"encoding/json"
	"net/netip"
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
		"relative resolv":  func(b *BundleSpec) { b.ResolvConf = "resolv.conf" },
		"unclean resolv":   func(b *BundleSpec) { b.ResolvConf = "/run/ctld/../resolv.conf" },
		"relative bind":    func(b *BundleSpec) { b.Binds = []Bind{{Source: "vol", Destination: "/data"}} },
		"bind at root":     func(b *BundleSpec) { b.Binds = []Bind{{Source: "/v/data", Destination: "/"}} },
		"unclean bind":     func(b *BundleSpec) { b.Binds = []Bind{{Source: "/v/data", Destination: "/data/../etc"}} },
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

// TestResolvConf: a bundle with a generated resolv.conf binds it read-only
// over the guest's /etc/resolv.conf (last, over the root); without one the
// guest keeps its RootFS's. The file names only the given nameservers and
// is readable by any guest uid.
func TestResolvConf(t *testing.T) {
	s, err := BuildSpec(goodBundle())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range s.Mounts {
		if m.Destination == "/etc/resolv.conf" {
			t.Errorf("no ResolvConf, yet a mount %+v", m)
		}
	}
	b := goodBundle()
	b.ResolvConf = "/run/ctld/bundles/sbx-1.g2/resolv.conf"
	if s, err = BuildSpec(b); err != nil {
		t.Fatal(err)
	}
	last := s.Mounts[len(s.Mounts)-1]
	if last.Destination != "/etc/resolv.conf" || last.Type != "bind" || last.Source != b.ResolvConf || !slices.Contains(last.Options, "ro") || !slices.Contains(last.Options, "rbind") {
		t.Errorf("resolv.conf mount = %+v", last)
	}

	path := filepath.Join(t.TempDir(), "bundle", ResolvConfFile)
	if err := WriteResolvConf(path, nil); err == nil {
		t.Error("WriteResolvConf without a nameserver: accepted")
	}
	ns := []netip.Addr{netip.MustParseAddr("10.200.0.2"), netip.MustParseAddr("fd00:c71d::1")}
	if err := WriteResolvConf(path, ns); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	want := "# Written by ctld: the sandbox's DNS proxy on the node (read-only).\nnameserver 10.200.0.2\nnameserver fd00:c71d::1\n"
	if err != nil || string(got) != want {
		t.Errorf("resolv.conf = %q, %v; want %q", got, err, want)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("resolv.conf mode: %v, %v; want 0644", fi, err)
	}
}

// TestBuildSpecAgent: with an agent, the agent is the init (the workload
// its args after "--"), runs as root with root's capabilities, gets its
// settings in env (never the nonce), and its two directories are bound at fixed paths
// (the binary's read-only); a workload env may not set agent settings.
func TestBuildSpecAgent(t *testing.T) {
	b := goodBundle()
	b.UID, b.GID = 1000, 1001
	b.Agent = &Agent{BinDir: "/run/ctld/agents/x/bin", SocketDir: "/run/ctld/agents/x/sock", Env: []string{"CTL_AGENT_UID=1000"}}
	s, err := BuildSpec(b)
	if err != nil {
		t.Fatal(err)
	}
	p := s.Process
	want := []string{"/.ctl-bin/ctl-agent", "--socket", "/.ctl/agent.sock", "--nonce-file", "/.ctl/nonce", "--", "sleep", "1000"}
	if !slices.Equal(p.Args, want) || p.User.UID != 0 || p.User.GID != 0 {
		t.Errorf("process args %q user %+v; want %q as 0:0", p.Args, p.User, want)
	}
	if !slices.Contains(p.Env, "CTL_AGENT_UID=1000") || !slices.Contains(p.Env, "A=b") {
		t.Errorf("env %q: want the agent's settings and the workload's", p.Env)
	}
	if !slices.Equal(p.Capabilities.Effective, Capabilities) {
		t.Errorf("agent capabilities %q, want root's %q", p.Capabilities.Effective, Capabilities)
	}
	var bin, sock *specs.Mount
	for i, m := range s.Mounts {
		switch m.Destination {
		case "/.ctl-bin":
			bin = &s.Mounts[i]
		case "/.ctl":
			sock = &s.Mounts[i]
		}
	}
	if bin == nil || bin.Source != b.Agent.BinDir || !slices.Contains(bin.Options, "ro") {
		t.Errorf("binary mount %+v", bin)
	}
	if sock == nil || sock.Source != b.Agent.SocketDir || !slices.Contains(sock.Options, "rw") {
		t.Errorf("socket mount %+v", sock)
	}
	for _, bad := range []func(*BundleSpec){
		func(b *BundleSpec) { b.Env = append(b.Env, "CTL_AGENT_NONCE=mine") },
		func(b *BundleSpec) { b.Agent.Env = []string{"NONCE=x"} },
		func(b *BundleSpec) { b.Agent.Env = []string{"CTL_AGENT_NONCE=n1"} },
		func(b *BundleSpec) { b.Agent.BinDir = "rel/bin" },
		func(b *BundleSpec) { b.Agent.SocketDir = "/a/../b" },
	} {
		c := goodBundle()
		c.Agent = &Agent{BinDir: "/b", SocketDir: "/s", Env: []string{"CTL_AGENT_UID=1"}}
		bad(&c)
		if _, err := BuildSpec(c); err == nil {
			t.Errorf("BuildSpec(%+v, agent %+v) accepted", c.Env, c.Agent)
		}
	}
}

// TestBuildSpecBinds: a volume's bind is a read-write rbind, nosuid and
// nodev, after the node's own mounts (so nothing of theirs covers it).
func TestBuildSpecBinds(t *testing.T) {
	b := goodBundle()
	b.Binds = []Bind{{Source: "/var/lib/ctld/volmounts/data", Destination: "/data"}}
	s, err := BuildSpec(b)
	if err != nil {
		t.Fatal(err)
	}
	last := s.Mounts[len(s.Mounts)-1]
	if last.Destination != "/data" || last.Source != "/var/lib/ctld/volmounts/data" || last.Type != "bind" ||
		strings.Join(last.Options, ",") != "rbind,rw,nosuid,nodev" {
		t.Errorf("last mount %+v, want the volume's rw bind at /data", last)
	}
}

// TestBuildSpecWarmAgent: a warm member's init is the agent alone
// (--warm, no workload) with CAP_SYS_ADMIN added to root's set for the
// claim's hostname, never inheritable or ambient; a cold agent never gets
// it; a warm spec with a workload is refused.
func TestBuildSpecWarmAgent(t *testing.T) {
	b := goodBundle()
	b.Args = nil
	b.Agent = &Agent{BinDir: "/b", SocketDir: "/s", Env: []string{"CTL_AGENT_UID=1000"}, Warm: true}
	s, err := BuildSpec(b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Process.Args, WarmAgentArgs()) || !slices.Contains(s.Process.Args, "--warm") || !slices.Contains(s.Process.Args, "--hostname-cap") {
		t.Errorf("warm args %q", s.Process.Args)
	}
	c := s.Process.Capabilities
	for name, set := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted} {
		if !slices.Contains(set, WarmCapability) {
			t.Errorf("warm %s set %q lacks %s", name, set, WarmCapability)
		}
	}
	if len(c.Inheritable) > 0 || len(c.Ambient) > 0 {
		t.Errorf("warm inheritable %q ambient %q, want none", c.Inheritable, c.Ambient)
	}
	b.Agent.Warm = false
	b.Args = []string{"sleep", "1"}
	if s, err := BuildSpec(b); err != nil || slices.Contains(s.Process.Capabilities.Bounding, WarmCapability) {
		t.Errorf("a cold agent's spec: %v, bounding %q", err, s.Process.Capabilities.Bounding)
	}
	b.Agent.Warm = true
	if _, err := BuildSpec(b); err == nil {
		t.Error("a warm spec with a workload was accepted")
	}
}
