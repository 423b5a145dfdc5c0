// Package ktest is the kernel-test convention of ctld.
//
// Kernel tests touch real cgroups, NBD devices, nftables, netns, mounts and
// runsc. They run only when asked for (CTLD_KERNEL_TESTS=1, which the test VM
// sets); otherwise they skip with a visible reason. When asked for, anything
// missing (root, a cgroup v2 controller, /dev/nbd*, nf_tables, runsc) is a
// failure, never a skip: a kernel claim that was not exercised is not proven.
package ktest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// EnvVar asks for kernel tests when set to "1".
const EnvVar = "CTLD_KERNEL_TESTS"

// CgroupRoot is where the test VM mounts the cgroup v2 hierarchy.
const CgroupRoot = "/sys/fs/cgroup"

// Asked reports whether kernel tests were asked for.
func Asked() bool { return os.Getenv(EnvVar) == "1" }

// Require skips the test unless kernel tests were asked for, and fails it if
// they were asked for but the process is not root.
func Require(t testing.TB) {
	t.Helper()
	if !Asked() {
		t.Skipf("kernel test: needs root in the test VM; run `make test-vm` (sets %s=1)", EnvVar)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("kernel test asked for (%s=1) but not running as root (euid %d)", EnvVar, os.Geteuid())
	}
}

// RequireCgroup2 fails unless the unified hierarchy is mounted at CgroupRoot
// with every named controller enabled for children.
func RequireCgroup2(t testing.TB, controllers ...string) {
	t.Helper()
	Require(t)
	b, err := os.ReadFile(filepath.Join(CgroupRoot, "cgroup.subtree_control"))
	if err != nil {
		t.Fatalf("cgroup v2 not mounted at %s: %v", CgroupRoot, err)
	}
	have := map[string]bool{}
	for _, c := range strings.Fields(string(b)) {
		have[c] = true
	}
	for _, c := range controllers {
		if !have[c] {
			t.Fatalf("cgroup v2 controller %q not enabled in %s/cgroup.subtree_control (have %q)", c, CgroupRoot, strings.TrimSpace(string(b)))
		}
	}
}

// RequireNBD fails unless the nbd driver is loaded with at least one device.
func RequireNBD(t testing.TB) {
	t.Helper()
	Require(t)
	if _, err := os.Stat("/sys/block/nbd0"); err != nil {
		t.Fatalf("nbd driver not loaded (no /sys/block/nbd0): %v; modprobe nbd nbds_max=16", err)
	}
}

// RequireBinary fails unless name is on PATH, returning its path.
func RequireBinary(t testing.TB, name string) string {
	t.Helper()
	Require(t)
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("required binary %q not found: %v", name, err)
	}
	return p
}
