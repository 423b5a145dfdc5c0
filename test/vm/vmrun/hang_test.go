package main

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLockupRE(t *testing.T) {
	for _, tc := range []struct {
		line string
		want bool
	}{
		{"[  521.123456] watchdog: BUG: soft lockup - CPU#1 stuck for 495s! [ctld:192]", true},
		{"[   60.052025] NMI watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [bash:228]", true},
		{"[   24.713693] rcu: INFO: rcu_sched detected stalls on CPUs/tasks:", true},
		{"[   24.713693] rcu: INFO: rcu_preempt self-detected stall on CPU", true},
		{"[   30.0] rcu_preempt self-detected stall on CPU", true},
		// A test's intended OOM kill or a slow hrtimer is not a lockup.
		{"[   94.933168] hrtimer: interrupt took 18977910 ns", false},
		{"[  100.0] Memory cgroup out of memory: Killed process 812 (sh)", false},
		{"--- PASS: TestSoftLockupWording (0.00s)", false},
	} {
		if got := lockupRE.MatchString(tc.line); got != tc.want {
			t.Errorf("lockupRE(%q) = %v, want %v", tc.line, got, tc.want)
		}
	}
}

// fakeMonitor answers like qemu's human monitor: a banner, a prompt, and
// for each command its echo, an answer and the next prompt.
func fakeMonitor(t *testing.T, answers map[string]string) (monitor, *[]string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "mon.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var got []string
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("QEMU 7.2.0 monitor - type 'help' for more information\r\n(qemu) "))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err == nil {
				cmd := strings.TrimSpace(line)
				got = append(got, cmd)
				c.Write([]byte(cmd + "\r\n\x1b[K" + answers[cmd] + "\r\n(qemu) "))
			}
			c.Close()
		}
	}()
	return monitor{path: path}, &got
}

func TestMonitorCmd(t *testing.T) {
	m, got := fakeMonitor(t, map[string]string{"info cpus": "* CPU #0: thread_id=12\r\n  CPU #1: thread_id=13"})
	out, err := m.cmd("info cpus", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := "* CPU #0: thread_id=12\n  CPU #1: thread_id=13"; cleanMonitor(out) != want {
		t.Fatalf("answer %q, want %q", cleanMonitor(out), want)
	}
	if len(*got) != 1 || (*got)[0] != "info cpus" {
		t.Fatalf("monitor saw %q", *got)
	}
}

func TestDumpGuestAsksForEveryCPUAndTask(t *testing.T) {
	m, got := fakeMonitor(t, nil)
	dumpGuest(m, "test", 0, symtab{})
	want := []string{"info cpus", "info registers -a", "sendkey alt-sysrq-9", "sendkey alt-sysrq-l", "sendkey alt-sysrq-w", "sendkey alt-sysrq-t"}
	if strings.Join(*got, "|") != strings.Join(want, "|") {
		t.Fatalf("monitor commands %q, want %q", *got, want)
	}
}

func TestBootRetryingOnlyAfterLockups(t *testing.T) {
	for _, tc := range []struct {
		name    string
		results []bootResult
		retries int
		boots   int
		lockups int
		final   string
	}{
		{"clean", []bootResult{{}}, 1, 1, 0, ""},
		{"a test failure is not retried", []bootResult{{exitErr: errors.New("exit 1")}}, 1, 1, 0, ""},
		{"lockup then clean", []bootResult{{lockup: "soft lockup - CPU#0"}, {}}, 1, 2, 1, ""},
		{"lockup twice, one retry", []bootResult{{lockup: "soft lockup - CPU#0"}, {lockup: "soft lockup - CPU#1"}}, 1, 2, 1, "soft lockup - CPU#1"},
		{"no retries", []bootResult{{lockup: "soft lockup - CPU#0"}}, 0, 1, 0, "soft lockup - CPU#0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			boots, resets := 0, 0
			res, lockups, err := bootRetrying(context.Background(), tc.retries,
				func() (bootResult, error) { boots++; return tc.results[boots-1], nil },
				func() error { resets++; return nil })
			if err != nil {
				t.Fatal(err)
			}
			if boots != tc.boots || resets != tc.boots-1 || len(lockups) != tc.lockups || res.lockup != tc.final {
				t.Fatalf("boots %d resets %d lockups %q final %q; want boots %d, %d lockups, final %q",
					boots, resets, lockups, res.lockup, tc.boots, tc.lockups, tc.final)
			}
		})
	}
}

func TestResetShareClearsResults(t *testing.T) {
	share := t.TempDir()
	for _, p := range []string{"out/0.rc", "done", "dmesg.txt", "guest.sh", "bin/x.test"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(share, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(share, p), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := resetShare(share); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"out", "done", "dmesg.txt"} {
		if _, err := os.Stat(filepath.Join(share, p)); !os.IsNotExist(err) {
			t.Errorf("%s still there after reset (err %v)", p, err)
		}
	}
	for _, p := range []string{"guest.sh", "bin/x.test"} {
		if _, err := os.Stat(filepath.Join(share, p)); err != nil {
			t.Errorf("%s gone after reset: %v", p, err)
		}
	}
}

func TestVCPUSummaryNamesWhereEachCPUIs(t *testing.T) {
	p := filepath.Join(t.TempDir(), "System.map")
	m := "ffffffff81000000 T _stext\nffffffff81100000 t smp_call_function_many_cond\nffffffff81100400 D some_data\nffffffff81200000 T native_safe_halt\n"
	if err := os.WriteFile(p, []byte(m), 0o644); err != nil {
		t.Fatal(err)
	}
	syms, err := loadSymtab(p)
	if err != nil {
		t.Fatal(err)
	}
	regs := `CPU#0
RAX=0000000000000000 RBX=0000000000000001
RIP=ffffffff81100123 RFL=00000202 [-------] CPL=0 II=0 A20=1 SMM=0 HLT=0
CPU#1
RAX=0000000000000000 RBX=0000000000000001
RIP=ffffffff8120000b RFL=00000246 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=1`
	got := vcpuSummary(regs, syms)
	want := []string{
		"vCPU 0 running at ffffffff81100123 (smp_call_function_many_cond+0x123)",
		"vCPU 1 halted at ffffffff8120000b (native_safe_halt+0xb)",
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("summary %q, want %q", got, want)
	}
}
