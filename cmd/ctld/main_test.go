package main

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type result struct {
	code           int
	stdout, stderr string
}

// ctld runs the whole CLI in-process, as main does.
func ctld(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return result{code, out.String(), errb.String()}
}

// A mistake in the command line exits 2 with one line naming it on stderr,
// before anything runs (no root check, no dirs made).
func TestRunUsageErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "unknown flag: --bogus"},
		{[]string{"bogus"}, `unknown command "bogus" for "ctld"`},
		{[]string{"status", "extra"}, `unknown command "extra" for "ctld status"`},
		{[]string{"status", "--json=maybe"}, `invalid argument "maybe" for "--json"`},
		{[]string{"run"}, `--slot must be a or b, got ""`},
		{[]string{"run", "--slot", "c"}, `--slot must be a or b, got "c"`},
		{[]string{"run", "--slot", "a", "--guest-oom-score-adj", "1001"}, "--guest-oom-score-adj must be between 0 and 1000, got 1001"},
		{[]string{"run", "--slot", "a", "--max-concurrent-claims", "0"}, "--max-concurrent-claims and --max-concurrent-execs must be at least 1"},
		{[]string{"run", "--slot", "a", "--max-file-bytes", "0"}, "--max-file-bytes must be at least 1"},
		{[]string{"run", "--slot", "a", "--usage-retention", "0s"}, "--usage-retention must be positive and --usage-records at least 0, got 0s and 0"},
		{[]string{"run", "--slot", "a", "--usage-records", "-1"}, "--usage-retention must be positive and --usage-records at least 0, got 168h0m0s and -1"},
		{[]string{"run", "--slot", "a", "--log-max-bytes", "1"}, "--log-max-bytes: "},
		{[]string{"run", "--slot", "a", "--default-disk-bytes", "1"}, "--default-disk-bytes must be between"},
		{[]string{"run", "--slot", "a", "--disk-project-base", "0"}, "--disk-project-base must be between"},
		{[]string{"run", "--slot", "a", "--net-pool-v4", "10.200.0.1/16"}, "has host bits set"},
		{[]string{"run", "--slot", "a", "--net-pool-v4", "fd00::/64"}, "is not an IPv4 prefix"},
		{[]string{"run", "--slot", "a", "--net-pool-v4-bits", "29"}, "must be /31 or /30"},
		{[]string{"run", "--slot", "a", "--net-pool-v6", "2001:db8::/64"}, "is not inside the ULA range"},
		{[]string{"run", "--slot", "a", "--net-pool-v6-bits", "126"}, "--net-pool-v6-bits needs --net-pool-v6"},
		{[]string{"run", "--slot", "a", "--dns-proxy-port", "53"}, "--dns-proxy-port must be"},
		{[]string{"run", "--slot", "a", "--dns-upstream", "resolver.example"}, `--dns-upstream "resolver.example"`},
		{[]string{"run", "--slot", "a", "--net-max-rules", "0"}, "--net-max-rules must be between 1 and 256"},
		{[]string{"run", "--slot", "a", "--warm-carriers", "-1"}, "--warm-carriers must not be negative"},
		{[]string{"run", "--slot", "a", "--warm-pool", "busybox"}, `want TEMPLATE=N, got "busybox"`},
		{[]string{"run", "--slot", "a", "--warm-pool-budget", "-1"}, "--warm-pool-budget must be between 0 and 1000, got -1"},
		{[]string{"run", "--slot", "a", "--warm-pool-max-age", "10s"}, "--warm-pool-max-age must be at least 1m0s, got 10s"},
		{[]string{"run", "--slot", "a", "--warm-pool-refill-every", "0s"}, "--warm-pool-refill-every must be at least 10ms, got 0s"},
		{[]string{"run", "--slot", "a", "--metrics-listen", "9464"}, `--metrics-listen "9464": want [SLOT=]HOST:PORT`},
		{[]string{"run", "--slot", "a", "--metrics-listen", "c=:9464"}, `--metrics-listen "c=:9464": slot must be a or b`},
		{[]string{"run", "--slot", "a", "--dns-element-min-ttl", "0s"}, "--dns-element-min-ttl must be between 1s and 1h0m0s, got 0s"},
		{[]string{"run", "--slot", "a", "--dns-element-min-ttl", "2h"}, "--dns-element-min-ttl must be between 1s and 1h0m0s, got 2h0m0s"},
		{[]string{"run", "--slot", "a", "--dns-element-min-ttl", "5"}, `invalid argument "5" for "--dns-element-min-ttl"`},
		{[]string{"run", "--slot", "a", "--dns-element-grace", "500ms"}, "--dns-element-grace must be between 1s and 1h0m0s, got 500ms"},
		{[]string{"run", "--slot", "a", "--dns-element-grace", "-1s"}, "--dns-element-grace must be between 1s and 1h0m0s, got -1s"},
		{[]string{"run", "--slot", "a", "--agent-binary", dir + "/no-ctl-agent"}, "--agent-binary: the guest agent binary: stat " + dir + "/no-ctl-agent: no such file"},
		{[]string{"run", "--slot", "a", "--agent-binary", "/bin/sh"}, "is dynamically linked"},
		// Without the flag: ctl-agent beside the (test) binary, which has none.
		{[]string{"run", "--slot", "a"}, "--agent-binary: the guest agent binary: stat "},
	} {
		args := append([]string{"--state-dir", dir + "/state", "--run-dir", dir + "/run"}, tc.args...)
		r := ctld(t, args...)
		if r.code != exitUsage || !strings.HasPrefix(r.stderr, "ctld: ") || !strings.Contains(r.stderr, tc.want) ||
			!strings.HasSuffix(r.stderr, "\nRun 'ctld --help' for usage.\n") || r.stdout != "" {
			t.Errorf("ctld %v = exit %d\nstdout: %q\nstderr: %q\nwant exit 2 and %q on stderr", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
	if r := ctld(t, "--state-dir", dir+"/state", "--run-dir", dir+"/run", "run", "--slot", "a", "--guest-oom-score-adj", "-1"); r.code != exitUsage {
		t.Errorf("negative --guest-oom-score-adj: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, d := range []string{"state", "run"} {
		if _, err := os.Stat(filepath.Join(dir, d)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after usage errors, %s: %v; want it never made", d, err)
		}
	}
}

func TestRunVersion(t *testing.T) {
	if r := ctld(t, "version"); r.code != exitOK || r.stdout != version+"\n" || r.stderr != "" {
		t.Fatalf("ctld version = %+v", r)
	}
}

// doctor prints every check with its fix to stdout and fails (exit 1) when
// one fails: here the cgroup root is an empty dir.
func TestRunDoctorReportsFailedChecks(t *testing.T) {
	cg := t.TempDir()
	r := ctld(t, "--state-dir", t.TempDir(), "doctor", "--cgroup-root", cg)
	if r.code != exitError {
		t.Fatalf("doctor with no cgroup2: exit %d, want 1\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "FAIL cgroup v2") || !strings.Contains(r.stdout, "no cgroup2 at "+cg) ||
		!strings.Contains(r.stdout, "     fix: boot with systemd.unified_cgroup_hierarchy=1") {
		t.Errorf("doctor output lacks the failed cgroup check and its fix:\n%s", r.stdout)
	}
	if !strings.HasPrefix(r.stderr, "ctld: ") || !strings.HasSuffix(r.stderr, "check(s) failed\n") || strings.Contains(r.stderr, "usage") {
		t.Errorf("doctor stderr = %q, want one line counting the failed checks", r.stderr)
	}
}
