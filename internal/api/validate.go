package api

import (
	"fmt"
	"path"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/lease"
	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/netpolicy"
)

// IDs of sandboxes, leases and templates become cgroup names, directory
// names, netns names and parts of nft object names, so they are held to the
// one rule of package names (names.CheckID, a DNS label).

// Operation IDs are chosen by the manager and are only journal keys, so
// they may be longer and use a few more characters (UUIDs, ULIDs,
// "manager:seq"), but ".." is refused so they are safe in a path anyway.
var opIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)

const opIDRule = "must be 1-128 characters of A-Z, a-z, 0-9 and '_.:-', starting with a letter or digit, without \"..\""

// Limits of a request. The resource limits are the lease's own (package
// lease), so a claim the API accepts is a lease the node can make; the
// others are far above what a sane caller sends and far below what would
// hurt the node.
const (
	MinCPUMillis      = lease.MinCPUMillis
	MaxCPUMillis      = lease.MaxCPUMillis
	MinMemoryBytes    = lease.MinMemoryBytes
	MaxMemoryBytes    = lease.MaxMemoryBytes
	MaxPIDs           = lease.MaxPIDs
	MinDiskBytes      = 1 << 20 // a disk lease below 1 MiB holds not even a copied-up file
	MaxDiskBytes      = 1 << 50 // 1 PiB
	MaxCpusetLen      = lease.MaxCpusetLen
	MaxArgs           = 4096
	MaxEnv            = 4096
	MaxArgvEnvBytes   = 256 << 10 // all args and env together, near ARG_MAX/8
	MaxPathBytes      = 4096      // PATH_MAX
	MaxLifetimeSec    = 366 * 24 * 3600
	MaxExecTimeoutSec = 7 * 24 * 3600
)

// Supported modes: every one is implemented. A node without the
// subsystem a mode needs (no NBD block store, no network) refuses that
// mode with unavailable when the claim reaches it (fail closed).
const (
	RootFSOverlay RootFSMode = "overlay"
	RootFSBlock   RootFSMode = "block"

	NetworkDenyAll  NetworkMode = "deny_all"
	NetworkOpen     NetworkMode = "open"
	NetworkRestrict NetworkMode = "restricted"
)

// EffectiveMode is the network mode a policy stands for: an empty mode is
// deny_all.
func (p NetworkPolicy) EffectiveMode() NetworkMode {
	if p.Mode == "" {
		return NetworkDenyAll
	}
	return p.Mode
}

// Spec is the policy as written, for netpolicy.Parse.
func (p NetworkPolicy) Spec() netpolicy.Spec {
	s := netpolicy.Spec{Mode: string(p.Mode)}
	for _, r := range p.Rules {
		s.Rules = append(s.Rules, netpolicy.RuleSpec{CIDR: r.CIDR, Domain: r.Domain, Protocol: r.Protocol, Ports: r.Ports})
	}
	return s
}

// Parse validates the whole policy (mode and every rule, with the default
// limits) and returns its normal form; the error is invalid_argument and
// names the offending field.
func (p NetworkPolicy) Parse() (netpolicy.Policy, error) {
	return netpolicy.ParseDefault("network", p.Spec())
}

// Validate checks the policy of a live update (the body of POST
// /v1/sandboxes/{id}/network): the same checks, and so the same errors, as
// a claim's network.
func (p NetworkPolicy) Validate() error {
	_, err := p.Parse()
	return err
}

func invalid(format string, args ...any) *errdefs.Error {
	return errdefs.Errorf(errdefs.CodeInvalidArgument, format, args...)
}

// ValidateOperationID checks the operation_id of a mutating request.
func ValidateOperationID(s string) error {
	if s == "" {
		return invalid("operation_id is empty: %s", opIDRule)
	}
	if !opIDPattern.MatchString(s) || strings.Contains(s, "..") {
		return invalid("invalid operation_id %s: %s", errdefs.Quote(s), opIDRule)
	}
	return nil
}

// ValidateFilePath checks a path inside a sandbox's root. It only checks
// the form; the node resolves it inside the root (a ".." cannot leave it).
func ValidateFilePath(p string) error {
	if why := filePathProblem(p); why != "" {
		return invalid("invalid path %s: %s", errdefs.Quote(p), why)
	}
	return nil
}

func filePathProblem(p string) string {
	switch {
	case p == "":
		return "empty: must be an absolute path inside the sandbox"
	case strings.IndexByte(p, 0) >= 0:
		return "contains a NUL byte"
	case len(p) > MaxPathBytes:
		return fmt.Sprintf("longer than %d bytes", MaxPathBytes)
	case !strings.HasPrefix(p, "/"):
		return "must be absolute"
	}
	return ""
}

// Validate checks a claim before it reaches the node.
func (r ClaimRequest) Validate() error {
	if err := ValidateOperationID(r.OperationID); err != nil {
		return err
	}
	if r.Generation < 1 {
		return invalid("generation must be >= 1, got %d", r.Generation)
	}
	switch r.RootFS.Mode {
	case RootFSOverlay, RootFSBlock:
	case "":
		return invalid("rootfs.mode is empty: must be %q or %q", RootFSOverlay, RootFSBlock)
	default:
		return invalid("unknown rootfs.mode %s: must be %q or %q", errdefs.Quote(string(r.RootFS.Mode)), RootFSOverlay, RootFSBlock)
	}
	if err := names.CheckID("rootfs.template", r.RootFS.Template); err != nil {
		return err
	}
	if err := r.Resources.validate(); err != nil {
		return err
	}
	// Every mode is valid here; a node without the subsystems a mode
	// needs refuses it itself (unavailable), before anything is journaled.
	if _, err := r.Network.Parse(); err != nil {
		return err
	}
	if err := validateCommand("process", r.Process.Args, r.Process.Env, r.Process.Cwd, false); err != nil {
		return err
	}
	if r.Process.UID == noID || r.Process.GID == noID {
		return invalid("process.uid %d, process.gid %d: %d is not a user or group id", r.Process.UID, r.Process.GID, noID)
	}
	if r.MaxLifetimeSec < 0 || r.MaxLifetimeSec > MaxLifetimeSec {
		return invalid("max_lifetime_sec must be between 0 (none) and %d, got %d", MaxLifetimeSec, r.MaxLifetimeSec)
	}
	if r.OnExit != "" && r.OnExit != OnExitKeep && r.OnExit != OnExitRelease {
		return invalid("on_exit must be %q or %q, got %q", OnExitKeep, OnExitRelease, r.OnExit)
	}
	return validateVolumes(r.Volumes)
}

// reservedGuestPaths are mounted by the node itself: a volume at or under
// one would hide or be hidden by it.
var reservedGuestPaths = []string{"/proc", "/dev", "/sys", "/tmp", "/etc/resolv.conf", "/.ctl-bin", "/.ctl"}

// validateVolumes checks a claim's volume mounts: at most MaxVolumes,
// valid IDs, each used once, paths absolute and clean, not "/", not
// reserved, and none inside another (mount order would decide which one
// the guest sees).
func validateVolumes(vs []VolumeMount) error {
	if len(vs) > MaxVolumes {
		return invalid("%d volumes: at most %d", len(vs), MaxVolumes)
	}
	under := func(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	for i, v := range vs {
		if v.Head != nil {
			return invalid("volumes[%d].head is the node's answer, not a claim's (expect_head bounds the head)", i)
		}
		if err := names.CheckID(fmt.Sprintf("volumes[%d].id", i), v.ID); err != nil {
			return err
		}
		if why := filePathProblem(v.Path); why != "" {
			return invalid("invalid volumes[%d].path %s: %s", i, errdefs.Quote(v.Path), why)
		}
		if path.Clean(v.Path) != v.Path || v.Path == "/" {
			return invalid("invalid volumes[%d].path %s: must be clean and not /", i, errdefs.Quote(v.Path))
		}
		for _, r := range reservedGuestPaths {
			if under(v.Path, r) {
				return invalid("invalid volumes[%d].path %s: %s is the node's", i, errdefs.Quote(v.Path), r)
			}
		}
		for j, w := range vs[:i] {
			if w.ID == v.ID {
				return invalid("volumes[%d] and volumes[%d] both attach volume %s", j, i, v.ID)
			}
			if under(v.Path, w.Path) || under(w.Path, v.Path) {
				return invalid("volumes[%d].path %s and volumes[%d].path %s overlap", j, errdefs.Quote(w.Path), i, errdefs.Quote(v.Path))
			}
		}
	}
	return nil
}

func (r Resources) validate() error {
	if r.CPUMillis < MinCPUMillis || r.CPUMillis > MaxCPUMillis {
		return invalid("resources.cpu_millis must be between %d and %d, got %d", MinCPUMillis, MaxCPUMillis, r.CPUMillis)
	}
	if r.MemoryBytes < MinMemoryBytes || r.MemoryBytes > MaxMemoryBytes {
		return invalid("resources.memory_bytes must be between %d and %d, got %d", int64(MinMemoryBytes), int64(MaxMemoryBytes), r.MemoryBytes)
	}
	if r.PIDs < 1 || r.PIDs > MaxPIDs {
		return invalid("resources.pids must be between 1 and %d, got %d", MaxPIDs, r.PIDs)
	}
	if r.DiskBytes != 0 && (r.DiskBytes < MinDiskBytes || r.DiskBytes > MaxDiskBytes) {
		return invalid("resources.disk_bytes must be 0 (the node's default) or between %d and %d, got %d", int64(MinDiskBytes), int64(MaxDiskBytes), r.DiskBytes)
	}
	if r.Cpuset != "" {
		if err := validateCpuset(r.Cpuset); err != nil {
			return err
		}
	}
	return nil
}

// validateCpuset checks the cpuset.cpus list form ("0-3,8,10-11") with
// the lease's own parser.
func validateCpuset(s string) error {
	if err := lease.ValidateCpuset(s); err != nil {
		return invalid("invalid resources.cpuset %s: %v (want a list like \"0-3,8\")", errdefs.Quote(s), err)
	}
	return nil
}

// validateCommand checks args, env and cwd of a process. Args become argv
// of execve, so a NUL byte would be cut silently; env must be K=V.
func validateCommand(field string, args, env []string, cwd string, needArgs bool) error {
	if needArgs && len(args) == 0 {
		return invalid("%s.args is empty: need the command to run", field)
	}
	if len(args) > MaxArgs {
		return invalid("%s.args has %d entries, more than %d", field, len(args), MaxArgs)
	}
	if len(env) > MaxEnv {
		return invalid("%s.env has %d entries, more than %d", field, len(env), MaxEnv)
	}
	total := 0
	for i, a := range args {
		if strings.IndexByte(a, 0) >= 0 {
			return invalid("%s.args[%d] contains a NUL byte", field, i)
		}
		if !utf8.ValidString(a) {
			return invalid("%s.args[%d] is not valid UTF-8", field, i)
		}
		total += len(a) + 1
	}
	if len(args) > 0 && args[0] == "" {
		return invalid("%s.args[0] is empty: need the command to run", field)
	}
	for i, e := range env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" {
			return invalid("%s.env[%d] %s is not of the form KEY=VALUE", field, i, errdefs.Quote(e))
		}
		if strings.IndexByte(e, 0) >= 0 {
			return invalid("%s.env[%d] contains a NUL byte", field, i)
		}
		if !utf8.ValidString(e) {
			return invalid("%s.env[%d] is not valid UTF-8", field, i)
		}
		total += len(e) + 1
	}
	if total > MaxArgvEnvBytes {
		return invalid("%s.args and %s.env take %d bytes, more than %d", field, field, total, MaxArgvEnvBytes)
	}
	if cwd != "" {
		if why := filePathProblem(cwd); why != "" {
			return invalid("invalid %s.cwd %s: %s", field, errdefs.Quote(cwd), why)
		}
	}
	return nil
}

// noID is (uid_t)-1.
const noID = ^uint32(0)

// Validate checks an exec request before it reaches the node.
func (r ExecRequest) Validate() error {
	if err := validateCommand("exec", r.Args, r.Env, r.Cwd, true); err != nil {
		return err
	}
	if r.TimeoutSec < 0 || r.TimeoutSec > MaxExecTimeoutSec {
		return invalid("timeout_sec must be between 0 (none) and %d, got %d", MaxExecTimeoutSec, r.TimeoutSec)
	}
	if u := r.User; u != nil && (u.UID == noID || u.GID == noID) {
		// (uid_t)-1 means "unchanged" to setresuid, not a user.
		return invalid("user %d:%d: %d is not a user or group id", u.UID, u.GID, noID)
	}
	return nil
}

// Validate checks a release request before it reaches the node. The
// generation is required so a late release cannot destroy a newer
// generation of the same sandbox.
func (r ReleaseRequest) Validate() error {
	if err := ValidateOperationID(r.OperationID); err != nil {
		return err
	}
	if r.Generation < 1 {
		return invalid("generation must be >= 1, got %d", r.Generation)
	}
	return nil
}
