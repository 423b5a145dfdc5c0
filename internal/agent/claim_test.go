package agent_test

import (
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

	"github.com/ctld/ctld/internal/agent"
	"github.com/ctld/ctld/internal/agent/client"
	"github.com/ctld/ctld/internal/agent/wire"
)

// children are the pids of pid's child processes.
func children(t *testing.T, pid int) []int {
	t.Helper()
	var out []int
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, s := range strings.Fields(string(b)) {
			n, _ := strconv.Atoi(s)
			out = append(out, n)
		}
	}
	return out
}

func wireCode(err error) string {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Code
	}
	return ""
}

// TestWarmClaimStartsTheClaimsWorkload: a warm agent boots with no
// workload and answers ready with its boot nonce; one claim starts the
// claim's command with exactly the claim's env (and PATH) in the claim's
// cwd, and from then on ready answers the claim's nonce; a second claim
// is refused (single use).
func TestWarmClaimStartsTheClaimsWorkload(t *testing.T) {
	a := startAgent(t, "--warm")
	ctx := ctxT(t, 30*time.Second)
	if got, err := a.c.Ready(ctx); err != nil || got != "nonce-123" {
		t.Fatalf("ready before the claim = %q, %v; want the boot nonce", got, err)
	}
	// One child: the workload's process, forked at boot, waiting for the
	// claim with nothing of the agent's environment.
	pre := children(t, a.cmd.Process.Pid)
	if len(pre) != 1 {
		t.Fatalf("a warm agent's children before its claim: %v, want its pre-forked workload alone", pre)
	}
	if env, err := os.ReadFile("/proc/" + strconv.Itoa(pre[0]) + "/environ"); err != nil || len(env) != 0 {
		t.Fatalf("the pre-forked workload's env before the claim: %q, %v; want none", env, err)
	}
	dir := t.TempDir()
	u := wire.User{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
	got, err := a.c.Claim(ctx, client.ClaimRequest{Nonce: "claim-n0nce", User: u, Args: []string{"sleep", "1000"}, Env: []string{"A=1", "B=two words"}, Cwd: dir})
	if err != nil || got != "claim-n0nce" {
		t.Fatalf("claim = %q, %v; want the claim's nonce", got, err)
	}
	if got, err := a.c.Ready(ctx); err != nil || got != "claim-n0nce" {
		t.Fatalf("ready after the claim = %q, %v; want the claim's nonce", got, err)
	}
	kids := children(t, a.cmd.Process.Pid)
	if !slices.Equal(kids, pre) {
		t.Fatalf("children after the claim = %v, want the workload alone, the pre-forked %v", kids, pre)
	}
	// The claim's answer comes once the command was found runnable; its
	// exec may still be under way.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(kids[0]) + "/cmdline"); string(cmdline) == "sleep\x001000\x00" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the workload never became sleep 1000")
		}
	}
	env, err := os.ReadFile("/proc/" + strconv.Itoa(kids[0]) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	gotEnv := strings.Split(strings.TrimSuffix(string(env), "\x00"), "\x00")
	wantEnv := []string{"PATH=" + agent.DefaultPath, "A=1", "B=two words"}
	if !slices.Equal(gotEnv, wantEnv) {
		t.Errorf("workload env = %q, want %q (nothing of the agent's boot)", gotEnv, wantEnv)
	}
	if cwd, err := os.Readlink("/proc/" + strconv.Itoa(kids[0]) + "/cwd"); err != nil || cwd != dir {
		t.Errorf("workload cwd = %q, %v; want %q", cwd, err, dir)
	}
	_, err = a.c.Claim(ctx, client.ClaimRequest{Nonce: "again", User: u, Args: []string{"true"}})
	if wireCode(err) != wire.CodeExists {
		t.Errorf("second claim = %v, want %s", err, wire.CodeExists)
	}
}

// TestWarmClaimRefusesBadClaims: a claim the agent cannot take is refused
// with invalid and leaves the member claimable; a cold agent (workload
// from boot) refuses every claim.
func TestWarmClaimRefusesBadClaims(t *testing.T) {
	a := startAgent(t, "--warm")
	ctx := ctxT(t, 30*time.Second)
	u := wire.User{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
	for name, r := range map[string]client.ClaimRequest{
		"no nonce":     {User: u, Args: []string{"true"}},
		"long nonce":   {Nonce: strings.Repeat("n", 257), User: u, Args: []string{"true"}},
		"no command":   {Nonce: "n", User: u},
		"relative cwd": {Nonce: "n", User: u, Args: []string{"true"}, Cwd: "tmp"},
		"agent env":    {Nonce: "n", User: u, Args: []string{"true"}, Env: []string{agent.EnvUID + "=0"}},
		"bad hostname": {Nonce: "n", User: u, Args: []string{"true"}, Hostname: "-x"},
		// Without --hostname-cap (never on the host: it would rename it).
		"hostname without the cap": {Nonce: "n", User: u, Args: []string{"true"}, Hostname: "box"},
	} {
		if _, err := a.c.Claim(ctx, r); wireCode(err) != wire.CodeInvalid {
			t.Errorf("%s: claim = %v, want %s", name, err, wire.CodeInvalid)
		}
	}
	if got, err := a.c.Claim(ctx, client.ClaimRequest{Nonce: "ok", User: u, Args: []string{"sleep", "1000"}}); err != nil || got != "ok" {
		t.Fatalf("a good claim after refused ones = %q, %v", got, err)
	}

	// A short workload: a cold agent that gets its cleanup's SIGTERM
	// before it forwards signals ends at once, leaving its workload
	// holding the test's stderr pipe until it exits.
	cold := startAgent(t, "--", "sleep", "3")
	if _, err := cold.c.Claim(ctx, client.ClaimRequest{Nonce: "n", User: u, Args: []string{"true"}}); wireCode(err) != wire.CodeInvalid {
		t.Errorf("claim on a cold agent = %v, want %s", err, wire.CodeInvalid)
	}
	if got, err := cold.c.Ready(ctx); err != nil || got != "nonce-123" {
		t.Errorf("cold ready after a refused claim = %q, %v", got, err)
	}
}

// TestWarmClaimWorkloadEndsTheAgent: the claimed workload's exit code is
// the agent's, as a cold agent's; a workload that cannot start is
// not_started and the member stays used.
func TestWarmClaimWorkloadEndsTheAgent(t *testing.T) {
	a := startAgent(t, "--warm")
	ctx := ctxT(t, 30*time.Second)
	u := wire.User{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
	if _, err := a.c.Claim(ctx, client.ClaimRequest{Nonce: "n", User: u, Args: []string{"/no/such/command"}}); wireCode(err) != wire.CodeNotStarted {
		t.Fatalf("claim of a missing command = %v, want %s", err, wire.CodeNotStarted)
	}
	if _, err := a.c.Claim(ctx, client.ClaimRequest{Nonce: "n", User: u, Args: []string{"true"}}); wireCode(err) != wire.CodeExists {
		t.Fatalf("claim after a failed one = %v, want %s (single use)", err, wire.CodeExists)
	}

	b := startAgent(t, "--warm")
	if _, err := b.c.Claim(ctx, client.ClaimRequest{Nonce: "n", User: u, Args: []string{"sh", "-c", "exit 7"}}); err != nil {
		t.Fatal(err)
	}
	err := b.cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("agent exit = %v, want 7 (the workload's)", err)
	}
}

// TestWarmTakesNoWorkload: --warm with a workload, and --hostname-cap
// without --warm, are usage errors.
func TestWarmTakesNoWorkload(t *testing.T) {
	if code := agent.Main([]string{"--warm", "--nonce-file", "x", "--", "true"}, nil, &strings.Builder{}); code != 2 {
		t.Fatalf("Main(--warm -- true) = %d, want 2", code)
	}
	if code := agent.Main([]string{"--hostname-cap", "--nonce-file", "x", "--", "true"}, nil, &strings.Builder{}); code != 2 {
		t.Fatalf("Main(--hostname-cap -- true) = %d, want 2", code)
	}
}

// TestWarmClaimPreforkedChecks: the pre-forked workload process answers
// the claim only for a command it can exec: a file without the execute
// bit, a file the kernel cannot run (no ELF, no #!) and a missing cwd are
// not_started with the reason; a pre-forked process killed before the
// claim makes the claim not_started too (the node falls back to a cold
// claim), never a hang.
func TestWarmClaimPreforkedChecks(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	u := wire.User{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
	dir := t.TempDir()
	noX := filepath.Join(dir, "not-executable")
	text := filepath.Join(dir, "plain-text")
	if err := os.WriteFile(noX, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(text, []byte("echo hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		req  client.ClaimRequest
		want string
	}{
		"no execute bit": {client.ClaimRequest{Args: []string{noX}}, "permission denied"},
		"not a program":  {client.ClaimRequest{Args: []string{text}}, "exec format error"},
		"missing cwd":    {client.ClaimRequest{Args: []string{"true"}, Cwd: filepath.Join(dir, "gone")}, "chdir"},
	} {
		a := startAgent(t, "--warm")
		c.req.Nonce, c.req.User = "n", u
		_, err := a.c.Claim(ctx, c.req)
		if wireCode(err) != wire.CodeNotStarted || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: claim = %v, want %s naming %q", name, err, wire.CodeNotStarted, c.want)
		}
	}
	a := startAgent(t, "--warm")
	// Ready: the agent serves once its pre-forked process waits.
	if _, err := a.c.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	pre := children(t, a.cmd.Process.Pid)
	if len(pre) != 1 {
		t.Fatalf("children before the claim: %v", pre)
	}
	if err := syscall.Kill(pre[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.Claim(ctx, client.ClaimRequest{Nonce: "n", User: u, Args: []string{"true"}}); wireCode(err) != wire.CodeNotStarted {
		t.Fatalf("claim after its pre-forked process died = %v, want %s", err, wire.CodeNotStarted)
	}
}
