package kernel_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/lease"
)

// TestCgroupLeaseIsReal is the regression test for "kernel tests must run
// against a real cgroup v2": it makes a ctld-owned parent and a lease,
// reads the limits back from the kernel, runs a process in the lease, shows
// pids.max refusing a fork, kills the lease through cgroup.kill and removes
// it. On a machine without cgroup v2 controllers any of these fails.
func TestCgroupLeaseIsReal(t *testing.T) {
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	ctx := t.Context()

	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	m := &lease.Manager{Parent: "ctld-kt-" + hex.EncodeToString(b[:]) + ".slice"}
	parentDir := filepath.Join(ktest.CgroupRoot, m.Parent)
	if err := m.Init(ctx); err != nil {
		t.Fatalf("init parent: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Remove(context.Background(), "kt"); err != nil {
			t.Errorf("cleanup lease: %v", err)
		}
		if err := os.Remove(parentDir); err != nil {
			t.Errorf("cleanup parent: %v", err)
		}
	})
	// The parent must be a real cgroup: the kernel fills in its files.
	if _, err := os.Stat(filepath.Join(parentDir, "cgroup.procs")); err != nil {
		t.Fatalf("parent %s is not a cgroup: %v", parentDir, err)
	}

	const pidsMax = 3
	s := lease.Spec{ID: "kt", CPUMillis: 500, MemoryBytes: 64 << 20, PIDs: pidsMax}
	if err := m.Create(ctx, s); err != nil {
		t.Fatalf("create lease: %v", err)
	}
	dir := m.Dir(s.ID)
	for name, want := range map[string]string{
		"cpu.max":    "50000 100000",
		"memory.max": strconv.Itoa(64 << 20),
		"pids.max":   strconv.Itoa(pidsMax),
	} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("read back %s: %v", name, err)
		}
		if strings.TrimSpace(string(got)) != want {
			t.Errorf("%s = %q, want %q", name, strings.TrimSpace(string(got)), want)
		}
	}

	// Start processes directly in the lease until pids.max is reached.
	cgfd, err := os.Open(dir)
	if err != nil {
		t.Fatalf("open lease dir: %v", err)
	}
	defer cgfd.Close()
	var cmds []*exec.Cmd
	defer func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	start := func() error {
		c := exec.Command("/bin/sh", "-c", "exec sleep 600")
		c.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgfd.Fd())}
		if err := c.Start(); err != nil {
			return err
		}
		cmds = append(cmds, c)
		return nil
	}
	for i := range pidsMax {
		if err := start(); err != nil {
			t.Fatalf("start process %d in lease: %v", i+1, err)
		}
	}
	procs := cgroupProcs(t, dir)
	for _, c := range cmds {
		if !slices.Contains(procs, strconv.Itoa(c.Process.Pid)) {
			t.Errorf("pid %d not in %s/cgroup.procs %v", c.Process.Pid, dir, procs)
		}
	}
	if err := start(); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("fork beyond pids.max=%d: err = %v, want EAGAIN", pidsMax, err)
	}

	// Kill through the kernel: cgroup.kill, then wait for "populated 0".
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
		t.Fatalf("write cgroup.kill: %v", err)
	}
	for _, c := range cmds {
		err := c.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("pid %d ended with %v, want SIGKILL", c.Process.Pid, err)
		}
	}
	cmds = nil
	deadline := time.Now().Add(5 * time.Second)
	for {
		ev, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		if err != nil {
			t.Fatalf("read cgroup.events: %v", err)
		}
		if strings.Contains(string(ev), "populated 0") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease still populated after cgroup.kill: %q", ev)
		}
		time.Sleep(10 * time.Millisecond)
	}

	if err := m.Remove(ctx, s.ID); err != nil {
		t.Fatalf("remove lease: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lease dir after remove: %v, want not exist", err)
	}
	if ok, detail := m.CheckGone(ctx, s.ID); !ok {
		t.Fatalf("cleanup proof: %s", detail)
	}
}

func cgroupProcs(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		t.Fatalf("read cgroup.procs: %v", err)
	}
	return strings.Fields(string(b))
}
