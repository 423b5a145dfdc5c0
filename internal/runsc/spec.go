// Package runsc describes a sandbox as an OCI bundle and drives the stock
// gVisor runsc binary through its OCI runtime command line.
//
// BuildSpec is pure data (unit-tested as such); WriteBundle and Runtime are the
// thin code that applies it.
package runsc

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/ctld/ctld/internal/fsutil"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// OCIVersion is the runtime-spec version written into config.json: the one
// runsc 20221219 implements ("1.0.2-dev"), not the newer Go module's.
const OCIVersion = "1.0.2"

// cpuPeriod is the CFS period every lease uses, in microseconds.
const cpuPeriod = 100_000

// DefaultGuestOOMScoreAdj is the oom_score_adj of a guest's runsc
// processes unless configured: positive, so under host memory pressure the
// kernel kills guests before ctld (OOMScoreAdjust=-900 in its unit, which
// runsc would otherwise inherit) and before ordinary host daemons (0).
const DefaultGuestOOMScoreAdj = 500

// Rlimit defaults. NPROC follows the lease's PIDs when it has one.
const (
	rlimitNOFILE = 65_536
	rlimitNPROC  = 65_536
)

// idPattern is what a container ID must look like: it becomes a path under
// the runsc root and a process argument, so no slashes, no leading dot/dash.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// ValidID reports whether id is acceptable as a container ID.
func ValidID(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("invalid container id %q: must match %s", id, idPattern)
	}
	return nil
}

// Capabilities is the whole capability set a root guest gets: what a
// package-installing, file-owning, port-binding root user needs and nothing
// that reaches past gVisor (no NET_RAW, SYS_ADMIN, MKNOD, SYS_PTRACE).
var Capabilities = []string{
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FOWNER",
	"CAP_FSETID",
	"CAP_KILL",
	"CAP_NET_BIND_SERVICE",
	"CAP_SETGID",
	"CAP_SETPCAP",
	"CAP_SETUID",
	"CAP_SYS_CHROOT",
}

// MaskedPaths and ReadonlyPaths are runc's defaults (`runc spec`).
var (
	MaskedPaths = []string{
		"/proc/acpi",
		"/proc/asound",
		"/proc/kcore",
		"/proc/keys",
		"/proc/latency_stats",
		"/proc/timer_list",
		"/proc/timer_stats",
		"/proc/sched_debug",
		"/sys/firmware",
		"/proc/scsi",
	}
	ReadonlyPaths = []string{
		"/proc/bus",
		"/proc/fs",
		"/proc/irq",
		"/proc/sys",
		"/proc/sysrq-trigger",
	}
)

// BundleSpec is everything ctld decides about one runtime generation's
// container.
type BundleSpec struct {
	ContainerID, RootPath, Hostname string
	// NetnsPath is an existing netns (e.g. /run/netns/x) the container joins;
	// runsc's netstack takes over its links.
	NetnsPath string
	// CgroupsPath is the lease cgroup relative to the cgroup2 mount, e.g.
	// "/ctld.slice/<lease>". ctld pre-creates it and sets its limits; runsc
	// then only joins it (it leaves pre-existing cgroups' limits and
	// existence alone).
	CgroupsPath string
	// Zero means no limit for the resource.
	CPUMillis, MemoryBytes, PIDs int64
	Args, Env                    []string
	Cwd                          string // default "/"
	UID, GID                     uint32
	ReadonlyRoot                 bool
	// OOMScoreAdj is written as process.oomScoreAdj; runsc gives it to the
	// sandbox and gofer processes. 0 to 1000: a guest is never more
	// protected from the OOM killer than an ordinary process.
	OOMScoreAdj int
	// ResolvConf, if set, is a file on the host (WriteResolvConf) bound
	// read-only over the guest's /etc/resolv.conf.
	ResolvConf string
	// Agent, when set, makes the guest agent the container's init (see
	// Agent); Args, Env, UID and GID are then the workload's, which the
	// agent starts as its child.
	Agent *Agent
	// Binds are host directories bound read-write into the guest (the
	// persistent volumes' mounts), after every other mount.
	Binds []Bind
}

// Bind binds host directory Source at Destination in the guest.
type Bind struct{ Source, Destination string }

// Agent is how the guest agent (cmd/ctl-agent) runs as a container's init:
// its binary from a host directory bound read-only at AgentBinDir, its
// socket in a host directory bound read-write at AgentSocketDir (reached
// from the host with runsc --host-uds=create), its settings in Env, its
// nonce in the file AgentNonce of the socket directory. It runs as guest
// root with root's capabilities, so it can start the
// workload, and serve calls, as any user.
type Agent struct {
	BinDir, SocketDir string
	// Env is the agent's settings (the workload's uid and gid), in
	// process.env. Never the nonce: a process's environment, like its
	// argv, is readable by every guest user in /proc (the agent reads
	// the nonce from AgentNonce and removes it).
	Env []string
	// Warm makes the agent a warm pool member's (issue 27): started with
	// no workload (WarmAgentArgs; the spec's Args must be empty), and with
	// CAP_SYS_ADMIN on top of Capabilities, for the one purpose of setting
	// the claim's hostname; the agent drops it from every thread's
	// bounding set before it starts the claim's workload, so no exec'd
	// process of the guest ever holds it (not in inheritable or ambient).
	Warm bool
}

// WarmCapability is what a warm agent holds until its claim.
const WarmCapability = "CAP_SYS_ADMIN"

// The guest's view of the agent: fixed paths, the same in every guest.
const (
	AgentBinDir    = "/.ctl-bin"
	AgentSocketDir = "/.ctl"
	AgentBinary    = "ctl-agent"
	AgentSocket    = "agent.sock"
	// AgentNonce is the nonce file in the socket directory (mode 0400,
	// written by ctld before start, removed by the agent).
	AgentNonce = "nonce"
	// AgentEnvPrefix starts every agent setting: a workload env may not
	// use it (it would set or hide the agent's own).
	AgentEnvPrefix = "CTL_AGENT_"
)

// AgentArgs is the init command of a guest whose workload is args.
func AgentArgs(args []string) []string {
	return append([]string{path.Join(AgentBinDir, AgentBinary), "--socket", path.Join(AgentSocketDir, AgentSocket),
		"--nonce-file", path.Join(AgentSocketDir, AgentNonce), "--"}, args...)
}

// WarmAgentArgs is the process.args of a warm pool member: the agent
// alone, booted with no workload (a claim call names it, issue 27).
func WarmAgentArgs() []string {
	return []string{path.Join(AgentBinDir, AgentBinary), "--warm", "--hostname-cap", "--socket", path.Join(AgentSocketDir, AgentSocket),
		"--nonce-file", path.Join(AgentSocketDir, AgentNonce)}
}

// BuildSpec describes b as an OCI runtime spec. It has no effects.
func BuildSpec(b BundleSpec) (*specs.Spec, error) {
	if err := validate(b); err != nil {
		return nil, fmt.Errorf("build spec: %w", err)
	}
	cwd := b.Cwd
	if cwd == "" {
		cwd = "/"
	}
	env := b.Env
	if !hasEnv(env, "PATH") {
		env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	}
	oomScoreAdj := b.OOMScoreAdj
	nproc := uint64(rlimitNPROC)
	if b.PIDs > 0 {
		nproc = uint64(b.PIDs)
	}
	args, uid, gid := append([]string(nil), b.Args...), b.UID, b.GID
	env = append([]string(nil), env...)
	ms := mounts(b.ReadonlyRoot, b.ResolvConf)
	if a := b.Agent; a != nil {
		// The agent drops to the workload's user itself (it is told the
		// uid/gid in its env); it must start as root to do so.
		args, uid, gid = AgentArgs(args), 0, 0
		if a.Warm {
			if len(b.Args) > 0 {
				return nil, fmt.Errorf("build spec: a warm agent takes no workload (a claim names it), got %q", b.Args)
			}
			args = WarmAgentArgs()
		}
		env = append(env, a.Env...)
		ms = append(ms,
			specs.Mount{Destination: AgentBinDir, Type: "bind", Source: a.BinDir, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
			specs.Mount{Destination: AgentSocketDir, Type: "bind", Source: a.SocketDir, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		)
	}
	for _, b := range b.Binds {
		ms = append(ms, specs.Mount{Destination: b.Destination, Type: "bind", Source: b.Source, Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	}
	s := &specs.Spec{
		Version:  OCIVersion,
		Hostname: b.Hostname,
		Root:     &specs.Root{Path: b.RootPath, Readonly: b.ReadonlyRoot},
		Process: &specs.Process{
			User:            specs.User{UID: uid, GID: gid},
			Args:            args,
			Env:             env,
			Cwd:             cwd,
			NoNewPrivileges: true,
			Capabilities:    capabilities(uid, b.Agent != nil && b.Agent.Warm),
			// Always explicit: absent, runsc leaves its processes with
			// ctld's own (protective) oom_score_adj.
			OOMScoreAdj: &oomScoreAdj,
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Hard: rlimitNOFILE, Soft: rlimitNOFILE},
				{Type: "RLIMIT_NPROC", Hard: nproc, Soft: nproc},
			},
		},
		Mounts: ms,
		Linux: &specs.Linux{
			CgroupsPath: b.CgroupsPath,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: b.NetnsPath},
			},
			Resources:     resources(b),
			MaskedPaths:   append([]string(nil), MaskedPaths...),
			ReadonlyPaths: append([]string(nil), ReadonlyPaths...),
		},
	}
	return s, nil
}

func validate(b BundleSpec) error {
	var errs []error
	if err := ValidID(b.ContainerID); err != nil {
		errs = append(errs, err)
	}
	if !filepath.IsAbs(b.RootPath) || filepath.Clean(b.RootPath) != b.RootPath {
		errs = append(errs, fmt.Errorf("root path %q: must be absolute and clean", b.RootPath))
	}
	if !filepath.IsAbs(b.NetnsPath) || filepath.Clean(b.NetnsPath) != b.NetnsPath {
		errs = append(errs, fmt.Errorf("netns path %q: must be absolute and clean", b.NetnsPath))
	}
	if b.CgroupsPath != "" && (!path.IsAbs(b.CgroupsPath) || path.Clean(b.CgroupsPath) != b.CgroupsPath || b.CgroupsPath == "/") {
		errs = append(errs, fmt.Errorf("cgroups path %q: must be an absolute, clean path below the cgroup root", b.CgroupsPath))
	}
	if len(b.Hostname) > 64 || strings.ContainsAny(b.Hostname, "/\x00 ") {
		errs = append(errs, fmt.Errorf("hostname %q: not a host name", b.Hostname))
	}
	if b.ResolvConf != "" && (!filepath.IsAbs(b.ResolvConf) || filepath.Clean(b.ResolvConf) != b.ResolvConf) {
		errs = append(errs, fmt.Errorf("resolv.conf path %q: must be absolute and clean", b.ResolvConf))
	}
	for _, m := range b.Binds {
		if !filepath.IsAbs(m.Source) || filepath.Clean(m.Source) != m.Source || !path.IsAbs(m.Destination) || path.Clean(m.Destination) != m.Destination || m.Destination == "/" {
			errs = append(errs, fmt.Errorf("bind %q at %q: both must be absolute and clean, not /", m.Source, m.Destination))
		}
	}
	if b.CPUMillis < 0 || b.MemoryBytes < 0 || b.PIDs < 0 {
		errs = append(errs, fmt.Errorf("resources cpu=%dm memory=%d pids=%d: must not be negative", b.CPUMillis, b.MemoryBytes, b.PIDs))
	}
	if b.CPUMillis > 0 && b.CPUMillis < 10 {
		// cpu.max refuses quotas below 1ms per period.
		errs = append(errs, fmt.Errorf("cpu %dm: below the 10m minimum", b.CPUMillis))
	}
	if b.OOMScoreAdj < 0 || b.OOMScoreAdj > 1000 {
		errs = append(errs, fmt.Errorf("oom score adj %d: must be between 0 and 1000", b.OOMScoreAdj))
	}
	if warm := b.Agent != nil && b.Agent.Warm; !warm && (len(b.Args) == 0 || b.Args[0] == "") {
		errs = append(errs, errors.New("args: empty command"))
	}
	for _, e := range b.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" || strings.ContainsRune(e, 0) {
			errs = append(errs, fmt.Errorf("env %q: must be KEY=VALUE", e))
		}
	}
	if b.Cwd != "" && !path.IsAbs(b.Cwd) {
		errs = append(errs, fmt.Errorf("cwd %q: must be absolute", b.Cwd))
	}
	if a := b.Agent; a != nil {
		for _, d := range []string{a.BinDir, a.SocketDir} {
			if !filepath.IsAbs(d) || filepath.Clean(d) != d {
				errs = append(errs, fmt.Errorf("agent dir %q: must be absolute and clean", d))
			}
		}
		for _, e := range b.Env {
			if strings.HasPrefix(e, AgentEnvPrefix) {
				errs = append(errs, fmt.Errorf("env %q: %s is reserved for the guest agent", e, AgentEnvPrefix))
			}
		}
		for _, e := range a.Env {
			k, _, ok := strings.Cut(e, "=")
			if !ok || !strings.HasPrefix(k, AgentEnvPrefix) || strings.ContainsRune(e, 0) {
				errs = append(errs, fmt.Errorf("agent env %q: must be %sKEY=VALUE", e, AgentEnvPrefix))
			}
			if k == AgentEnvPrefix+"NONCE" {
				errs = append(errs, fmt.Errorf("agent env %q: the nonce goes in the %s file, never env", k, AgentNonce))
			}
		}
	}
	return errors.Join(errs...)
}

func hasEnv(env []string, key string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, key+"=") {
			return true
		}
	}
	return false
}

// capabilities gives root the whole minimal set and any other user only the
// bounding set, so a non-root guest holds no effective capability.
func capabilities(uid uint32, warm bool) *specs.LinuxCapabilities {
	caps := append([]string(nil), Capabilities...)
	if warm {
		caps = append(caps, WarmCapability) // the warm agent drops it at its claim
	}
	c := &specs.LinuxCapabilities{Bounding: caps}
	if uid == 0 {
		c.Effective = append([]string(nil), caps...)
		c.Permitted = append([]string(nil), caps...)
	}
	return c
}

func mounts(readonlyRoot bool, resolvConf string) []specs.Mount {
	ms := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	if readonlyRoot {
		// A read-only root still needs somewhere to write scratch files.
		ms = append(ms, specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}})
	}
	if resolvConf != "" {
		// Read-only: the guest cannot point itself at another resolver
		// (which the firewall would drop anyway) by accident.
		ms = append(ms, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: resolvConf, Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}})
	}
	return ms
}

// ResolvConfFile is the name of a bundle's generated resolv.conf.
const ResolvConfFile = "resolv.conf"

// ResolvConf is a resolv.conf naming nameservers (the sandbox's DNS
// proxy, reached at its gateway), and nothing else: no search domains of
// the node leak into the guest.
func ResolvConf(nameservers []netip.Addr) []byte {
	var b strings.Builder
	b.WriteString("# Written by ctld: the sandbox's DNS proxy on the node (read-only).\n")
	for _, a := range nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", a)
	}
	return []byte(b.String())
}

// WriteResolvConf writes ResolvConf(nameservers) to path durably, world
// readable (a guest user of any uid reads it through the gofer), making
// its directory if needed.
func WriteResolvConf(path string, nameservers []netip.Addr) error {
	if len(nameservers) == 0 {
		return errors.New("write resolv.conf: no nameserver")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("write resolv.conf: %w", err)
	}
	if err := fsutil.WriteFileAtomic(path, ResolvConf(nameservers), 0o644); err != nil {
		return fmt.Errorf("write resolv.conf: %w", err)
	}
	return nil
}

func resources(b BundleSpec) *specs.LinuxResources {
	r := &specs.LinuxResources{}
	if b.CPUMillis > 0 {
		quota := b.CPUMillis * cpuPeriod / 1000
		period := uint64(cpuPeriod)
		// 1024 shares per CPU, as the kubelet maps millicores.
		shares := max(uint64(b.CPUMillis)*1024/1000, 2)
		r.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period, Shares: &shares}
	}
	if b.MemoryBytes > 0 {
		limit := b.MemoryBytes
		// OCI swap is memory+swap: equal to the limit means no swap.
		swap := b.MemoryBytes
		r.Memory = &specs.LinuxMemory{Limit: &limit, Swap: &swap}
	}
	if b.PIDs > 0 {
		pids := b.PIDs
		r.Pids = &specs.LinuxPids{Limit: &pids}
	}
	return r
}

// WriteBundle writes s as dir/config.json durably (fsutil.WriteFileAtomic):
// an existing config.json is replaced atomically, a crash leaves the old or
// the new one.
func WriteBundle(dir string, s *specs.Spec) error {
	b, err := json.MarshalIndent(s, "", "\t")
	if err != nil {
		return fmt.Errorf("encode spec: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create bundle dir: %w", err)
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return fmt.Errorf("write bundle config: %w", err)
	}
	return nil
}
