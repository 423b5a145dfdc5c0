package api

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/netpolicy"
)

func TestValidateOperationID(t *testing.T) {
	good := []string{"op-1", "01HZX3K9", "mgr:42", "a.b_c-d", "550e8400-e29b-41d4-a716-446655440000", strings.Repeat("A", 128)}
	bad := []string{"", "..", "a..b", ".a", "-a", "a/b", "a b", "a\x00", "ü", strings.Repeat("A", 129)}
	for _, s := range good {
		if err := ValidateOperationID(s); err != nil {
			t.Errorf("ValidateOperationID(%q) = %v, want nil", s, err)
		}
	}
	for _, s := range bad {
		if err := ValidateOperationID(s); err == nil || !strings.Contains(err.Error(), "operation_id") {
			t.Errorf("ValidateOperationID(%q) = %v, want an error naming operation_id", s, err)
		}
	}
}

func TestValidateFilePath(t *testing.T) {
	for _, p := range []string{"/", "/etc/hosts", "/a/../b", strings.Repeat("/a", 2048)} {
		if err := ValidateFilePath(p); err != nil {
			t.Errorf("ValidateFilePath(%.20q) = %v, want nil", p, err)
		}
	}
	for p, want := range map[string]string{
		"":                              "empty",
		"etc/hosts":                     "absolute",
		"/a\x00b":                       "NUL",
		"/" + strings.Repeat("a", 4096): "4096 bytes",
	} {
		if err := ValidateFilePath(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateFilePath(%.20q) = %v, want error containing %q", p, err, want)
		}
	}
}

func validClaim() ClaimRequest {
	return ClaimRequest{
		OperationID: "op-1",
		Generation:  1,
		RootFS:      RootFS{Mode: RootFSOverlay, Template: "alpine"},
		Resources:   Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PIDs: 128},
		Process:     Process{Args: []string{"/bin/sleep", "inf"}, Env: []string{"PATH=/bin", "EMPTY="}, Cwd: "/"},
	}
}

func TestClaimValidate(t *testing.T) {
	if err := validClaim().Validate(); err != nil {
		t.Fatalf("valid claim: %v", err)
	}
	cases := []struct {
		name string
		mod  func(*ClaimRequest)
		want string // "" = valid
	}{
		{"deny_all explicit", func(r *ClaimRequest) { r.Network.Mode = "deny_all" }, ""},
		{"cpuset", func(r *ClaimRequest) { r.Resources.Cpuset = "0-3,8,10-11" }, ""},
		{"no args", func(r *ClaimRequest) { r.Process = Process{} }, ""},
		{"no operation id", func(r *ClaimRequest) { r.OperationID = "" }, "operation_id is empty"},
		{"bad operation id", func(r *ClaimRequest) { r.OperationID = "../x" }, "invalid operation_id"},
		{"generation 0", func(r *ClaimRequest) { r.Generation = 0 }, "generation must be >= 1"},
		{"block mode", func(r *ClaimRequest) { r.RootFS.Mode = "block" }, ""},
		{"block mode without template", func(r *ClaimRequest) { r.RootFS.Mode, r.RootFS.Template = "block", "" }, "rootfs.template is empty"},
		{"no mode", func(r *ClaimRequest) { r.RootFS.Mode = "" }, "rootfs.mode is empty"},
		{"odd mode", func(r *ClaimRequest) { r.RootFS.Mode = "tmpfs" }, "unknown rootfs.mode"},
		{"template traversal", func(r *ClaimRequest) { r.RootFS.Template = "../etc" }, "invalid rootfs.template"},
		{"no template", func(r *ClaimRequest) { r.RootFS.Template = "" }, "rootfs.template is empty"},
		{"cpu 0", func(r *ClaimRequest) { r.Resources.CPUMillis = 0 }, "resources.cpu_millis"},
		{"cpu huge", func(r *ClaimRequest) { r.Resources.CPUMillis = MaxCPUMillis + 1 }, "resources.cpu_millis"},
		{"memory negative", func(r *ClaimRequest) { r.Resources.MemoryBytes = -1 }, "resources.memory_bytes"},
		{"memory tiny", func(r *ClaimRequest) { r.Resources.MemoryBytes = 4096 }, "resources.memory_bytes"},
		{"memory huge", func(r *ClaimRequest) { r.Resources.MemoryBytes = 1 << 62 }, "resources.memory_bytes"},
		{"pids 0", func(r *ClaimRequest) { r.Resources.PIDs = 0 }, "resources.pids"},
		{"disk default", func(r *ClaimRequest) { r.Resources.DiskBytes = 0 }, ""},
		{"disk 1Gi", func(r *ClaimRequest) { r.Resources.DiskBytes = 1 << 30 }, ""},
		{"disk negative", func(r *ClaimRequest) { r.Resources.DiskBytes = -1 }, "resources.disk_bytes"},
		{"disk tiny", func(r *ClaimRequest) { r.Resources.DiskBytes = 4096 }, "resources.disk_bytes"},
		{"disk huge", func(r *ClaimRequest) { r.Resources.DiskBytes = 1 << 62 }, "resources.disk_bytes"},
		{"cpuset junk", func(r *ClaimRequest) { r.Resources.Cpuset = "0-3;rm" }, "resources.cpuset"},
		{"cpuset reversed", func(r *ClaimRequest) { r.Resources.Cpuset = "3-1" }, "resources.cpuset"},
		{"network open", func(r *ClaimRequest) { r.Network.Mode = "open" }, ""},
		{"network odd", func(r *ClaimRequest) { r.Network.Mode = "allow" }, "unknown network.mode"},
		// The whole policy is validated, so a bad rule gets its own
		// precise error.
		{"network restricted, good rules", func(r *ClaimRequest) {
			r.Network = NetworkPolicy{Mode: NetworkRestrict, Rules: []NetworkRule{{CIDR: "203.0.113.0/24", Ports: []string{"443"}}, {Domain: "*.example.com"}}}
		}, ""},
		{"network bad cidr", func(r *ClaimRequest) {
			r.Network = NetworkPolicy{Mode: NetworkRestrict, Rules: []NetworkRule{{CIDR: "203.0.113.0/24"}, {CIDR: "10.0.0.256/8"}}}
		}, `network.rules[1]: invalid cidr "10.0.0.256/8"`},
		{"network bad wildcard", func(r *ClaimRequest) {
			r.Network = NetworkPolicy{Mode: NetworkRestrict, Rules: []NetworkRule{{Domain: "a.*.example.com"}}}
		}, "network.rules[0]: invalid domain"},
		{"network bad port", func(r *ClaimRequest) {
			r.Network = NetworkPolicy{Mode: NetworkOpen, Rules: []NetworkRule{{CIDR: "10.0.0.0/8", Ports: []string{"70000"}}}}
		}, `network.rules[0] (cidr "10.0.0.0/8"): invalid port "70000"`},
		{"network deny_all with rules", func(r *ClaimRequest) {
			r.Network = NetworkPolicy{Rules: []NetworkRule{{CIDR: "10.0.0.0/8"}}}
		}, "takes no rules"},
		{"arg NUL", func(r *ClaimRequest) { r.Process.Args = []string{"/bin/sh", "a\x00b"} }, "process.args[1] contains a NUL"},
		{"empty argv0", func(r *ClaimRequest) { r.Process.Args = []string{""} }, "process.args[0] is empty"},
		{"too many args", func(r *ClaimRequest) { r.Process.Args = make([]string, MaxArgs+1) }, "more than"},
		{"args too big", func(r *ClaimRequest) { r.Process.Args = []string{"/bin/echo", strings.Repeat("x", MaxArgvEnvBytes)} }, "bytes, more than"},
		{"env no =", func(r *ClaimRequest) { r.Process.Env = []string{"PATH"} }, "KEY=VALUE"},
		{"env empty key", func(r *ClaimRequest) { r.Process.Env = []string{"=x"} }, "KEY=VALUE"},
		{"cwd relative", func(r *ClaimRequest) { r.Process.Cwd = "tmp" }, "process.cwd"},
		{"uid -1", func(r *ClaimRequest) { r.Process.UID = ^uint32(0) }, "not a user or group id"},
		{"gid -1", func(r *ClaimRequest) { r.Process.GID = ^uint32(0) }, "not a user or group id"},
		{"lifetime negative", func(r *ClaimRequest) { r.MaxLifetimeSec = -1 }, "max_lifetime_sec"},
		{"on_exit unknown", func(r *ClaimRequest) { r.OnExit = "vanish" }, "on_exit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := validClaim()
			c.mod(&r)
			err := r.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) || errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
				t.Fatalf("Validate() = %v, want invalid_argument containing %q", err, c.want)
			}
		})
	}
}

// TestNetworkModesMatch: the API's wire names of the modes are the
// policy model's.
func TestNetworkModesMatch(t *testing.T) {
	for _, m := range []NetworkMode{NetworkDenyAll, NetworkOpen, NetworkRestrict} {
		p, err := NetworkPolicy{Mode: m}.Parse()
		if err != nil || string(p.Mode) != string(m) {
			t.Errorf("mode %q parses as %q, %v", m, p.Mode, err)
		}
	}
	if len(netpolicy.Modes) != 3 {
		t.Errorf("netpolicy has %d modes, the API 3", len(netpolicy.Modes))
	}
}

func TestNetworkEffectiveMode(t *testing.T) {
	if m := (NetworkPolicy{}).EffectiveMode(); m != NetworkDenyAll {
		t.Errorf("empty mode = %q, want %q", m, NetworkDenyAll)
	}
}

func TestExecValidate(t *testing.T) {
	ok := ExecRequest{Args: []string{"/bin/true"}, TimeoutSec: 10}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid exec: %v", err)
	}
	for name, r := range map[string]ExecRequest{
		"no args":    {},
		"NUL arg":    {Args: []string{"/bin/echo", "\x00"}},
		"bad env":    {Args: []string{"/bin/true"}, Env: []string{"novalue"}},
		"bad cwd":    {Args: []string{"/bin/true"}, Cwd: "rel"},
		"neg timout": {Args: []string{"/bin/true"}, TimeoutSec: -1},
		"uid -1":     {Args: []string{"/bin/true"}, User: &User{UID: ^uint32(0)}},
		"gid -1":     {Args: []string{"/bin/true"}, User: &User{GID: ^uint32(0)}},
	} {
		if err := r.Validate(); err == nil || errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("%s: Validate() = %v, want invalid_argument", name, err)
		}
	}
}

func TestReleaseValidate(t *testing.T) {
	if err := (ReleaseRequest{OperationID: "op-2", Generation: 3}).Validate(); err != nil {
		t.Fatalf("valid release: %v", err)
	}
	for name, r := range map[string]ReleaseRequest{
		"no op":        {Generation: 1},
		"bad op":       {OperationID: "a/b", Generation: 1},
		"generation 0": {OperationID: "op-2"},
	} {
		if err := r.Validate(); err == nil || errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("%s: Validate() = %v, want invalid_argument", name, err)
		}
	}
}

// TestClaimVolumesValidate: a claim's volume mounts need valid IDs, each
// once, clean absolute paths that are not /, not the node's own mounts
// and not inside one another, and at most MaxVolumes of them.
func TestClaimVolumesValidate(t *testing.T) {
	ok := validClaim()
	ok.Volumes = []VolumeMount{{ID: "data", Path: "/data"}, {ID: "cache", Path: "/var/cache"}, {ID: "d2", Path: "/data2"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid volumes: %v", err)
	}
	many := make([]VolumeMount, MaxVolumes+1)
	for i := range many {
		many[i] = VolumeMount{ID: fmt.Sprintf("v%d", i), Path: fmt.Sprintf("/v%d", i)}
	}
	for name, c := range map[string]struct {
		vs   []VolumeMount
		want string
	}{
		"bad id":      {[]VolumeMount{{ID: "A/b", Path: "/a"}}, "volumes[0].id"},
		"relative":    {[]VolumeMount{{ID: "a", Path: "data"}}, "absolute"},
		"root":        {[]VolumeMount{{ID: "a", Path: "/"}}, "not /"},
		"unclean":     {[]VolumeMount{{ID: "a", Path: "/data/"}}, "clean"},
		"dotdot":      {[]VolumeMount{{ID: "a", Path: "/x/../proc"}}, "clean"},
		"reserved":    {[]VolumeMount{{ID: "a", Path: "/dev/x"}}, "/dev is the node's"},
		"agent":       {[]VolumeMount{{ID: "a", Path: "/.ctl"}}, "/.ctl is the node's"},
		"same id":     {[]VolumeMount{{ID: "a", Path: "/a"}, {ID: "a", Path: "/b"}}, "both attach volume a"},
		"same path":   {[]VolumeMount{{ID: "a", Path: "/a"}, {ID: "b", Path: "/a"}}, "overlap"},
		"nested":      {[]VolumeMount{{ID: "a", Path: "/a/b"}, {ID: "b", Path: "/a"}}, "overlap"},
		"too many":    {many, "at most"},
		"empty path":  {[]VolumeMount{{ID: "a"}}, "empty"},
		"nul in path": {[]VolumeMount{{ID: "a", Path: "/a\x00"}}, "NUL"},
	} {
		r := validClaim()
		r.Volumes = c.vs
		err := r.Validate()
		if err == nil || errdefs.CodeOf(err) != errdefs.CodeInvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want invalid_argument containing %q", name, err, c.want)
		}
	}
}
