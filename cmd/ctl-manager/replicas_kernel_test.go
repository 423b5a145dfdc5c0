package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/manager"
)

// TestKernelServeReplicaKilledMidCreate: two `ctl-manager serve`
// processes on one database in front of a real ctld with a real gVisor
// guest. Replica A is SIGKILLed while ctld claims a sandbox it asked for;
// replica B takes the create over once A's lease expired and settles it
// as ctld decided, exactly once: ctld rolls back a claim whose caller went
// away (seen: "mount overlay: context canceled"), so B finds it failed
// and fails the create with the reason, its quota share back; had ctld
// finished it, B completes it with the operation id A recorded. Either
// way ctld has the sandbox once, at generation 1, from that one
// operation, and the database says what ctld says.
func TestKernelServeReplicaKilledMidCreate(t *testing.T) {
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	ktest.RequireBinary(t, "runsc")
	socket := startCtld(t)
	e := &env{t: t, socket: socket, db: filepath.Join(t.TempDir(), "manager.db")}
	key := strings.TrimSpace(e.ok("key", "create", "--owner", "team-a"))
	args := []string{"--template", "busybox", "--default-timeout", "0", "--lease-ttl", "1s", "--create-timeout", "3m"}
	a := e.startServeChild("127.0.0.1:0", append(args, "--replica-id", "replica-a")...)
	b := e.startServeChild("127.0.0.1:0", append(args, "--replica-id", "replica-b")...)
	ca := &client.Client{BaseURL: "http://" + a.addr, Key: key}
	cb := &client.Client{BaseURL: "http://" + b.addr, Key: key}
	ctx := context.Background()
	node := &api.Client{SocketPath: socket}

	done := make(chan error, 1)
	go func() {
		_, err := ca.Create(ctx, client.CreateRequest{Template: "busybox", Labels: map[string]string{"case": "killed"}})
		done <- err
	}()
	// Kill A once ctld has the claim (claiming or already ready).
	var id string
	for deadline := time.Now().Add(60 * time.Second); id == ""; {
		if l, err := node.List(ctx); err == nil && len(l.Sandboxes) > 0 {
			id = l.Sandboxes[0].ID
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ctld never got the claim\nA's log:\n%s", a.stderr())
		}
		time.Sleep(5 * time.Millisecond)
	}
	a.kill()
	if err := <-done; err == nil {
		t.Fatal("the create answered although its replica was killed")
	}
	var sb client.Sandbox
	for deadline := time.Now().Add(3 * time.Minute); ; {
		var err error
		sb, err = cb.Get(ctx, id)
		if err == nil && (sb.State == client.StateReady || sb.State == client.StateFailed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s through B: %+v, %v; want settled\nB's log:\n%s", id, sb, err, b.stderr())
		}
		time.Sleep(100 * time.Millisecond)
	}
	nsb, err := node.Get(ctx, id)
	if err != nil || nsb.Generation != 1 || string(nsb.State) != map[string]string{client.StateReady: "ready", client.StateFailed: "failed"}[sb.State] {
		t.Fatalf("on ctld: %+v, %v; want generation 1, as the database says (%s)", nsb, err, sb.State)
	}
	st, err := manager.Open(ctx, e.db, nil)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := st.Operations(ctx, id)
	usage, uerr := st.Usage(ctx, "team-a")
	st.Close()
	wantOp := map[string]string{client.StateReady: manager.OpDone, client.StateFailed: manager.OpFailed}[sb.State]
	if err != nil || uerr != nil || len(ops) != 1 || ops[0].Kind != manager.KindClaim || ops[0].State != wantOp {
		t.Fatalf("recorded operations of %s: %+v, %v, %v; want the one claim, %s", id, ops, err, uerr, wantOp)
	}
	if !strings.Contains(b.stderr(), "taking over an operation") {
		t.Fatalf("B did not take the create over:\n%s", b.stderr())
	}
	if sb.State == client.StateFailed {
		if !strings.Contains(sb.Reason, "create interrupted") || usage.Sandboxes != 0 {
			t.Fatalf("failed create: reason %q, usage %+v; want the reason and the share back", sb.Reason, usage)
		}
		t.Logf("killed mid-claim: ctld rolled the claim back; B failed the create: %s (operation %s)", sb.Reason, ops[0].OperationID)
		return
	}
	d, err := cb.Destroy(ctx, id)
	if err != nil || !d.Proof.Verified || !d.Proof.Clean {
		t.Fatalf("destroy through B: %+v, %v", d, err)
	}
	t.Logf("killed mid-create: %s completed by B with operation %s; destroyed with proof %s", id, ops[0].OperationID, d.Proof.OperationID)
}
