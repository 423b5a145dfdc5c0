package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
)

// TestServiceOnExitOnCtld: one-shot sandboxes through `ctl-manager
// serve` over a real ctld. One created with on_exit destroy exits 7: the
// service records exited + 7, sends the exited event, destroys it with a
// verified clean proof, and ctld's leased capacity is back. One kept
// (on_exit keep) exits 5 while ctld is killed (SIGKILL): the restarted
// primary journals the exit, the service then shows it exited with code
// 5, and its destroy returns the proof.
func TestServiceOnExitOnCtld(t *testing.T) {
	e, s, cx, before := serviceOnCtld(t)
	events := make(chan client.Event, 64)
	ecx, cancel := context.WithCancel(cx)
	defer cancel()
	go s.c.EventsAfter(ecx, "", 0, func(ev client.Event) error { events <- ev; return nil })

	// Each workload waits for /tmp/go, then sleeps, then exits.
	wait := func(sleep, code string) []string {
		return []string{"/bin/sh", "-c", "while [ ! -e /tmp/go ]; do sleep 0.05; done; sleep " + sleep + "; exit " + code}
	}
	type created struct {
		sb  client.Sandbox
		err error
	}
	ch := make(chan created, 2)
	for _, req := range []client.CreateRequest{
		{Template: "busybox", Args: wait("0", "7"), OnExit: client.OnExitDestroy, Labels: map[string]string{"k": "destroy"}},
		{Template: "busybox", Args: wait("3", "5"), Labels: map[string]string{"k": "keep"}},
	} {
		go func() { sb, err := s.c.Create(cx, req); ch <- created{sb, err} }()
	}
	var gone, keep client.Sandbox
	for range 2 {
		r := <-ch
		if r.err != nil || r.sb.State != client.StateReady {
			t.Fatalf("create: %+v, %v", r.sb, r.err)
		}
		if r.sb.Labels["k"] == "destroy" {
			gone = r.sb
		} else {
			keep = r.sb
		}
	}
	goNow := func(id string) time.Time {
		if r, err := s.c.Exec(cx, id, client.ExecRequest{Args: []string{"/bin/touch", "/tmp/go"}}); err != nil || r.ExitCode != 0 {
			t.Fatalf("exec touch in %s: %+v, %v", id, r, err)
		}
		return time.Now()
	}

	// on_exit destroy.
	t0 := goNow(gone.ID)
	var sb client.Sandbox
	var err error
	for {
		if sb, err = s.c.Get(cx, gone.ID); err == nil && sb.State == client.StateDestroyed && sb.Reason != "" {
			// The reason is recorded just after the node's release.
			break
		}
		if time.Since(t0) > 2*time.Minute {
			t.Fatalf("on_exit destroy: %+v, %v", sb, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("on_exit destroy: destroyed %v after the exec that let it exit", time.Since(t0).Round(time.Millisecond))
	if sb.Exit == nil || sb.Exit.Kind != "exit" || sb.Exit.Code != 7 || sb.Reason != "exited: code 7" {
		t.Fatalf("destroyed on exit: %+v exit %+v", sb, sb.Exit)
	}
	ops, err := s.store.Operations(cx, gone.ID)
	if err != nil {
		t.Fatal(err)
	}
	verified := false
	for _, op := range ops {
		if op.Kind == "release" {
			p, err := s.store.Proof(cx, op.OperationID)
			verified = err == nil && p.Verified
		}
	}
	if !verified {
		t.Fatalf("no verified proof of the release on exit: %+v", ops)
	}

	// An exit while no primary runs.
	goNow(keep.ID)
	e.kill9("a")
	time.Sleep(6 * time.Second) // the workload exits 3 s after the exec
	e.start("a")
	e.waitPrimary("a", 2*time.Minute)
	ns, err := e.client().Get(cx, keep.ID)
	if err != nil || ns.State != api.StateExited || ns.Exit == nil || ns.Exit.Code != 5 {
		t.Fatalf("after the restart ctld has %+v exit %+v, %v; want exited code 5", ns.State, ns.Exit, err)
	}
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		if sb, err = s.c.Get(cx, keep.ID); err == nil && sb.State == client.StateExited {
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("kept sandbox: %+v, %v", sb, err)
		}
	}
	if sb.Exit == nil || sb.Exit.Code != 5 {
		t.Fatalf("kept sandbox: exit %+v", sb.Exit)
	}
	d, err := s.c.Destroy(cx, keep.ID)
	if err != nil || d.Sandbox.State != client.StateDestroyed || !d.Proof.Verified || !d.Proof.Clean {
		t.Fatalf("destroy of the exited sandbox: %+v, %v", d, err)
	}
	after, err := e.client().Node(cx)
	if err != nil || after.Capacity.Leased != before.Capacity.Leased {
		t.Fatalf("leased after: %+v, before %+v (%v)", after.Capacity.Leased, before.Capacity.Leased, err)
	}
	cancel()
	n := 0
	for len(events) > 0 {
		if ev := <-events; ev.Type == client.EventExited {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d exited events, want 2", n)
	}
}
