// Package kernel_test holds the regression tests that prove the test VM is
// a real sandbox host: cgroup v2, NBD, nftables, netns/veth, overlay, runsc.
package kernel_test

import (
	"os"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/ktest"
)

// TestVMHasSandboxHostFeatures fails if the kernel the tests run on lacks a
// feature a sandbox host needs.
func TestVMHasSandboxHostFeatures(t *testing.T) {
	ktest.RequireCgroup2(t, "cpu", "memory", "pids", "cpuset", "io")
	ktest.RequireNBD(t)
	for _, bin := range []string{"runsc", "nft", "ip", "mkfs.ext4", "mkfs.xfs"} {
		ktest.RequireBinary(t, bin)
	}
	fs, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		t.Fatalf("read /proc/filesystems: %v", err)
	}
	for _, want := range []string{"overlay", "xfs", "ext4", "cgroup2"} {
		if !strings.Contains(string(fs), "\t"+want+"\n") {
			t.Errorf("filesystem %s not available", want)
		}
	}
	mods, err := os.ReadFile("/proc/modules")
	if err != nil {
		t.Fatalf("read /proc/modules: %v", err)
	}
	for _, want := range []string{"nf_tables", "veth", "nbd"} {
		if !strings.Contains(string(mods), want+" ") {
			t.Errorf("module %s not loaded", want)
		}
	}
	if _, err := os.Stat("/proc/1/ns/net"); err != nil {
		t.Errorf("runsc needs /proc/1/ns/net visible: %v", err)
	}
}
