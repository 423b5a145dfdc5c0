package nodeagent_test

import (
	"context"
	"crypto/ed25519"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/manager/fakenode"
	"github.com/ctld/ctld/internal/nodeagent"
	"github.com/ctld/ctld/internal/pgtest"
)

// TestNodeProcessRecordsCtldsOwnRelease: ctld released a placed sandbox
// itself (on_exit release "exit-<cid>"); the database still said ready.
// A destroy's release, refused by ctld as already released, is recorded
// as ctld's release with ctld's proof, judged against the pinned key: a
// clean one returns the reservation and the destroy succeeds; one signed
// by another key keeps the reservation held.
func TestNodeProcessRecordsCtldsOwnRelease(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	st := open(t, dsn)
	f := fakenode.New("node-a")
	a := &nodeagent.Agent{Store: st, Client: &api.Client{SocketPath: fakenode.Serve(t, f)}, TTL: time.Minute, Templates: []string{"busybox"}, MaxSandboxes: 4}
	if _, err := a.Register(ctx); err != nil {
		t.Fatal(err)
	}
	spec := manager.Spec{Resources: api.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 32}, RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"}}
	for _, id := range []string{"sb1", "sb2"} {
		if _, err := st.Place(ctx, manager.PlaceIntent{SandboxID: id, OperationID: "c-" + id, Spec: spec}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := a.Step(ctx, "node-a"); n != 2 || err != nil {
		t.Fatalf("step: %d settled, %v", n, err)
	}
	reserved := func() int64 {
		t.Helper()
		n, err := st.FleetNode(ctx, "node-a")
		if err != nil {
			t.Fatal(err)
		}
		return n.Reserved.Sandboxes
	}
	if r := reserved(); r != 2 {
		t.Fatalf("reserved %d, want 2", r)
	}
	selfRelease := func(id string) string {
		t.Helper()
		sb, err := f.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		nodeOp := "exit-" + sb.ContainerID
		if _, err := f.SelfRelease(id, nodeOp); err != nil {
			t.Fatal(err)
		}
		return nodeOp
	}

	// A clean proof by the pinned key: recorded, reservation back, and a
	// replica's Destroy answers with it.
	nodeOp := selfRelease("sb1")
	m := &manager.Manager{Store: st, Fleet: &manager.Fleet{Poll: 10 * time.Millisecond}}
	type destroyed struct {
		res manager.DestroyResult
		err error
	}
	done := make(chan destroyed, 1)
	go func() {
		res, err := m.Destroy(ctx, "sb1")
		done <- destroyed{res, err}
	}()
	var settled int
	deadline := time.Now().Add(10 * time.Second)
	for settled == 0 && time.Now().Before(deadline) {
		n, err := a.Step(ctx, "node-a")
		if err != nil {
			t.Fatalf("step: %v", err)
		}
		settled += n
		time.Sleep(10 * time.Millisecond)
	}
	d := <-done
	if d.err != nil || !d.res.Verdict.OK() || d.res.OperationID != nodeOp || !d.res.AlreadyReleased {
		t.Fatalf("destroy = %+v, %v; want ctld's clean proof under %s", d.res, d.err, nodeOp)
	}
	if rec, err := st.Sandbox(ctx, "sb1"); err != nil || rec.State != api.StateReleased {
		t.Fatalf("sb1 recorded = %+v, %v", rec, err)
	}
	if r := reserved(); r != 1 {
		t.Fatalf("reserved %d after a verified clean release by ctld, want 1", r)
	}

	// Signed by another key: recorded released (ctld has nothing left),
	// the proof rejected, the reservation held.
	_, forged, _ := ed25519.GenerateKey(nil)
	f.Lock()
	f.Signer = forged
	f.Unlock()
	forgedOp := selfRelease("sb2")
	if _, _, err := st.RequestRelease(ctx, "sb2", "r-sb2"); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Step(ctx, "node-a"); n != 1 || err != nil {
		t.Fatalf("step: %d settled, %v", n, err)
	}
	pr, err := st.Proof(ctx, forgedOp)
	if err != nil || pr.Verified || !strings.Contains(pr.VerifyError, "pinned key") {
		t.Fatalf("stored forged proof = %+v, %v", pr, err)
	}
	if r := reserved(); r != 1 {
		t.Fatalf("reserved %d after a forged proof, want 1 (held)", r)
	}
	if op, err := st.Operation(ctx, "r-sb2"); err != nil || op.State != manager.OpFailed || !strings.Contains(op.Error, forgedOp) {
		t.Fatalf("r-sb2 = %+v, %v", op, err)
	}
}
