package manager

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager/fakenode"
)

// setup serves a fake node on a real Unix socket and returns a Manager
// talking to it through the real api.Client.
func setup(t *testing.T) (*Manager, *fakenode.Node) {
	t.Helper()
	n := fakenode.New("node-a")
	sock := fakenode.Serve(t, n)
	st := openTestStore(t)
	return &Manager{Store: st, Client: &api.Client{SocketPath: sock}}, n
}

func testSpec() Spec {
	return Spec{
		Resources: api.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PIDs: 256},
		RootFS:    api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"},
		Network:   api.NetworkPolicy{Mode: api.NetworkDenyAll},
	}
}

func TestCreateExecDestroy(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	res, err := m.Create(ctx, "sb1", testSpec())
	if err != nil {
		t.Fatal(err)
	}
	if res.Sandbox.State != api.StateReady || res.Sandbox.Generation != 1 || res.Reused {
		t.Fatalf("create = %+v", res)
	}
	rec, err := m.Store.Sandbox(ctx, "sb1")
	if err != nil || rec.State != api.StateReady || rec.NodeID != "node-a" {
		t.Fatalf("recorded = %+v, %v", rec, err)
	}
	if op, err := m.Store.Operation(ctx, res.OperationID); err != nil || op.State != OpDone {
		t.Fatalf("operation = %+v, %v", op, err)
	}

	var out, errb bytes.Buffer
	code, err := m.Exec(ctx, "sb1", api.ExecRequest{Args: []string{"echo", "hi", "there"}}, &out, &errb)
	if err != nil || code != 0 || out.String() != "hi there\n" {
		t.Fatalf("exec = %d, %v, %q", code, err, out.String())
	}
	out.Reset()
	code, err = m.Exec(ctx, "sb1", api.ExecRequest{Args: []string{"fail", "3", "bad"}}, &out, &errb)
	if err != nil || code != 3 || errb.String() != "bad\n" {
		t.Fatalf("exec fail = %d, %v, stderr %q", code, err, errb.String())
	}
	if err := m.WriteFile(ctx, "sb1", "/etc/x", []byte("data")); err != nil {
		t.Fatal(err)
	}
	if b, err := m.ReadFile(ctx, "sb1", "/etc/x"); err != nil || string(b) != "data" {
		t.Fatalf("read = %q, %v", b, err)
	}

	d, err := m.Destroy(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if !d.Verdict.Verified || !d.Verdict.Clean || !d.Verdict.OK() {
		t.Fatalf("verdict = %+v", d.Verdict)
	}
	pr, err := m.Store.Proof(ctx, d.OperationID)
	if err != nil || !pr.Verified || pr.Generation != 1 {
		t.Fatalf("stored proof = %+v, %v", pr, err)
	}
	node, err := m.Store.Node(ctx, "node-a")
	if err != nil || !bytes.Equal(node.PublicKey, n.Key.Public().(ed25519.PublicKey)) {
		t.Fatalf("pinned key = %x, %v; want the node key", node.PublicKey, err)
	}

	// Destroy again: already gone is success, with the same proof.
	again, err := m.Destroy(ctx, "sb1")
	if err != nil || !again.AlreadyReleased || again.OperationID != d.OperationID || !again.Verdict.OK() {
		t.Fatalf("second destroy = %+v, %v", again, err)
	}
	if len(n.ReleaseOps) != 1 {
		t.Fatalf("node saw %d releases, want 1", len(n.ReleaseOps))
	}

	// The identity survives: the next create is generation 2.
	res2, err := m.Create(ctx, "sb1", testSpec())
	if err != nil || res2.Sandbox.Generation != 2 {
		t.Fatalf("recreate = %+v, %v", res2, err)
	}

	v, err := m.VerifyProof(ctx, d.OperationID)
	if err != nil || !v.OK() || v.Source != "store" {
		t.Fatalf("verify stored = %+v, %v", v, err)
	}
}

func TestCreateRetryReusesOperationID(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	// The first answer is lost (node unavailable); the claim stays pending.
	drop := true
	n.Lock()
	n.FailClaim = func(api.ClaimRequest) error {
		if drop {
			drop = false
			return errdefs.Errorf(errdefs.CodeUnavailable, "node restarting")
		}
		return nil
	}
	n.Unlock()
	first, err := m.Create(ctx, "sb1", testSpec())
	if errdefs.CodeOf(err) != errdefs.CodeUnavailable {
		t.Fatalf("first create: %v, want unavailable", err)
	}
	if op, _ := m.Store.Operation(ctx, first.OperationID); op.State != OpPending {
		t.Fatalf("operation after lost answer = %+v, want pending", op)
	}
	second, err := m.Create(ctx, "sb1", testSpec())
	if err != nil {
		t.Fatal(err)
	}
	if !second.Reused || second.OperationID != first.OperationID || second.Sandbox.Generation != 1 {
		t.Fatalf("retry = %+v, first op %s", second, first.OperationID)
	}
	n.Lock()
	ops := append([]string(nil), n.ClaimOps...)
	n.Unlock()
	if len(ops) != 2 || ops[0] != ops[1] {
		t.Fatalf("node saw claim operations %v, want the same id twice", ops)
	}
}

func TestCreateAfterCrashBeforeCall(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	// A manager crashed right after recording its claim.
	if _, err := m.Store.PinNode(ctx, "node-a", "/s", nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Store.BeginClaim(ctx, ClaimIntent{SandboxID: "sb1", NodeID: "node-a", OperationID: "op-crashed"}); err != nil {
		t.Fatal(err)
	}
	res, err := m.Create(ctx, "sb1", testSpec())
	if err != nil || res.OperationID != "op-crashed" || !res.Reused {
		t.Fatalf("create after crash = %+v, %v", res, err)
	}
	if len(n.ClaimOps) != 1 || n.ClaimOps[0] != "op-crashed" {
		t.Fatalf("node saw %v", n.ClaimOps)
	}
}

func TestCreateDefinitiveFailureIsRecorded(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	n.Lock()
	n.FailClaim = func(api.ClaimRequest) error {
		return errdefs.Errorf(errdefs.CodeCapacityExhausted, "not enough memory: want 256Mi, free 0")
	}
	n.Unlock()
	res, err := m.Create(ctx, "sb1", testSpec())
	var ae *errdefs.Error
	if !errors.As(err, &ae) || ae.Code != errdefs.CodeCapacityExhausted || ae.Message != "not enough memory: want 256Mi, free 0" {
		t.Fatalf("create error = %v, want capacity_exhausted with the node's message", err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Fatalf("error is not one line: %q", err)
	}
	op, _ := m.Store.Operation(ctx, res.OperationID)
	if op.State != OpFailed || !strings.Contains(op.Error, "capacity_exhausted") {
		t.Fatalf("operation = %+v, want failed", op)
	}
	if rec, _ := m.Store.Sandbox(ctx, "sb1"); rec.State != api.StateFailed {
		t.Fatalf("sandbox state = %s, want failed", rec.State)
	}
	// A new try is a new operation and generation.
	n.Lock()
	n.FailClaim = nil
	n.Unlock()
	res2, err := m.Create(ctx, "sb1", testSpec())
	if err != nil || res2.Reused || res2.OperationID == res.OperationID || res2.Sandbox.Generation != 2 {
		t.Fatalf("create after failure = %+v, %v", res2, err)
	}
}

func TestCreateRefusesBadInputBeforeRecording(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	bad := testSpec()
	bad.Resources.MemoryBytes = 10
	for _, tc := range []struct {
		id   string
		spec Spec
	}{{"sb1", bad}, {"../etc", testSpec()}, {"UPPER", testSpec()}} {
		if _, err := m.Create(ctx, tc.id, tc.spec); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("create %q: %v, want invalid_argument", tc.id, err)
		}
	}
	if sbs, _ := m.Store.Sandboxes(ctx); len(sbs) != 0 {
		t.Fatalf("bad input was recorded: %+v", sbs)
	}
	if len(n.ClaimOps) != 0 {
		t.Fatalf("bad input reached the node: %v", n.ClaimOps)
	}
}

func TestDestroyRejectsProofFromAnotherKey(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	// The first release pins the node's key.
	if _, err := m.Create(ctx, "sb1", testSpec()); err != nil {
		t.Fatal(err)
	}
	if d, err := m.Destroy(ctx, "sb1"); err != nil || !d.Verdict.OK() {
		t.Fatalf("first destroy = %+v, %v", d, err)
	}
	// Then proofs come signed by another key (which they also carry).
	_, impostor, _ := ed25519.GenerateKey(nil)
	n.Lock()
	n.Signer = impostor
	n.Unlock()
	if _, err := m.Create(ctx, "sb2", testSpec()); err != nil {
		t.Fatal(err)
	}
	d, err := m.Destroy(ctx, "sb2")
	if err != nil {
		t.Fatal(err)
	}
	if d.Verdict.Verified || d.Verdict.OK() || !strings.Contains(d.Verdict.Reason, "pinned key") {
		t.Fatalf("verdict on forged proof = %+v, want rejected", d.Verdict)
	}
	pr, err := m.Store.Proof(ctx, d.OperationID)
	if err != nil || pr.Verified || pr.VerifyError == "" {
		t.Fatalf("stored forged proof = %+v, %v; want verified=false with a reason", pr, err)
	}
	// The pinned key did not move.
	node, _ := m.Store.Node(ctx, "node-a")
	if !bytes.Equal(node.PublicKey, n.Key.Public().(ed25519.PublicKey)) {
		t.Fatal("pinned key was replaced by the impostor's")
	}
	// Re-verifying later gives the same verdict.
	v, err := m.VerifyProof(ctx, d.OperationID)
	if err != nil || v.Verified {
		t.Fatalf("re-verify = %+v, %v", v, err)
	}
}

func TestDestroyUncleanProof(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	n.Unclean = []string{"mounts_absent"}
	if _, err := m.Create(ctx, "sb1", testSpec()); err != nil {
		t.Fatal(err)
	}
	d, err := m.Destroy(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if !d.Verdict.Verified || d.Verdict.Clean || d.Verdict.OK() || len(d.Verdict.FailedChecks) != 1 || d.Verdict.FailedChecks[0] != "mounts_absent" {
		t.Fatalf("verdict = %+v, want verified but not clean", d.Verdict)
	}
}

func TestDestroyAdoptsSandboxOnlyOnNode(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	n.Put(api.Sandbox{ID: "orphan", Generation: 4, State: api.StateReady, LeaseID: "l4"})
	l, err := m.Ls(ctx)
	if err != nil || len(l.Sandboxes) != 1 || l.Sandboxes[0].Status != StatusUnknownToStore {
		t.Fatalf("ls = %+v, %v", l, err)
	}
	d, err := m.Destroy(ctx, "orphan")
	if err != nil || !d.Verdict.OK() || d.Sandbox.Generation != 4 {
		t.Fatalf("destroy orphan = %+v, %v", d, err)
	}
	if _, err := m.Destroy(ctx, "never"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("destroy unknown: %v, want not_found", err)
	}
}

func TestLsAndGetMerge(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	for _, id := range []string{"a", "b"} {
		if _, err := m.Create(ctx, id, testSpec()); err != nil {
			t.Fatal(err)
		}
	}
	// b vanishes from the node behind the manager's back.
	n.Put(api.Sandbox{ID: "b", Generation: 1, State: api.StateLost})
	n.Put(api.Sandbox{ID: "c", Generation: 1, State: api.StateReady})
	l, err := m.Ls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range l.Sandboxes {
		got[e.ID] = e.Status
	}
	want := map[string]string{"a": StatusInSync, "b": StatusDrift, "c": StatusUnknownToStore}
	if len(got) != len(want) {
		t.Fatalf("ls = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("ls = %v, want %v", got, want)
		}
	}
	d, err := m.Get(ctx, "a")
	if err != nil || d.Sandbox == nil || d.Node == nil || len(d.Generations) != 1 || len(d.Operations) != 1 {
		t.Fatalf("get = %+v, %v", d, err)
	}
	if _, err := m.Get(ctx, "zzz"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("get unknown: %v", err)
	}
}

func TestUnreachableNode(t *testing.T) {
	ctx := context.Background()
	st := openTestStore(t)
	m := &Manager{Store: st, Client: &api.Client{SocketPath: filepath.Join(t.TempDir(), "none.sock")}}
	if _, err := m.Create(ctx, "sb1", testSpec()); errdefs.CodeOf(err) != errdefs.CodeUnavailable {
		t.Fatalf("create: %v, want unavailable", err)
	}
	// Nothing was recorded: the node was never reached.
	if sbs, _ := st.Sandboxes(ctx); len(sbs) != 0 {
		t.Fatalf("recorded %+v", sbs)
	}
	l, err := m.Ls(ctx)
	if err != nil || l.NodeError == "" {
		t.Fatalf("ls = %+v, %v; want store view with a node error", l, err)
	}
}

func TestVerifyProofFetchedFromNode(t *testing.T) {
	ctx := context.Background()
	m, _ := setup(t)
	// Another manager (another database) created and destroyed sb1.
	other := &Manager{Store: openTestStore(t), Client: m.Client}
	if _, err := other.Create(ctx, "sb1", testSpec()); err != nil {
		t.Fatal(err)
	}
	d, err := other.Destroy(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	v, err := m.VerifyProof(ctx, d.OperationID)
	if err != nil || !v.OK() || v.Source != "node" {
		t.Fatalf("verify fetched = %+v, %v", v, err)
	}
	if _, err := m.VerifyProof(ctx, "op-unknown"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("verify unknown: %v, want not_found", err)
	}
}

func TestDestroyRejectsTamperedProof(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	if _, err := m.Create(ctx, "sb1", testSpec()); err != nil {
		t.Fatal(err)
	}
	// The node key is pinned at first use, and the proof carries it, but
	// a check was flipped after signing.
	n.Lock()
	n.Unclean = []string{"mounts_absent"}
	n.Tamper = func(p *api.CleanupProof) {
		for i := range p.Checks {
			p.Checks[i].OK = true
		}
		p.Clean = true
	}
	n.Unlock()
	d, err := m.Destroy(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if d.Verdict.Verified || !strings.Contains(d.Verdict.Reason, "signature invalid") {
		t.Fatalf("verdict on tampered proof = %+v, want rejected for its signature", d.Verdict)
	}
}

// The version is part of what the node signed: a proof downgraded on the
// way (to the payload without a version) is refused, and an intact one
// verifies, so the manager checks the exact payload the node signed.
func TestDestroyRejectsDowngradedProofVersion(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	for i, tamper := range []func(p *api.CleanupProof){
		func(p *api.CleanupProof) { p.Version = 0 },
		nil,
	} {
		id := fmt.Sprintf("sb%d", i)
		if _, err := m.Create(ctx, id, testSpec()); err != nil {
			t.Fatal(err)
		}
		n.Lock()
		n.Tamper = tamper
		n.Unlock()
		d, err := m.Destroy(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if tamper != nil && (d.Verdict.Verified || !strings.Contains(d.Verdict.Reason, "signature invalid")) {
			t.Fatalf("verdict on a downgraded proof = %+v, want rejected for its signature", d.Verdict)
		}
		if tamper == nil && !d.Verdict.Verified {
			t.Fatalf("verdict on an intact proof = %+v, want verified", d.Verdict)
		}
	}
}

func TestCreateAsksForAGenerationNewerThanTheNodes(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	// The node has seen generation 5 (another manager, or a lost database).
	n.Put(api.Sandbox{ID: "sb1", Generation: 5, State: api.StateReleased})
	res, err := m.Create(ctx, "sb1", testSpec())
	if err != nil || res.Sandbox.Generation != 6 {
		t.Fatalf("create = %+v, %v; want generation 6", res, err)
	}
}

func TestDestroyRetryReusesOperationID(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	if _, err := m.Create(ctx, "sb1", testSpec()); err != nil {
		t.Fatal(err)
	}
	n.Lock()
	n.FailRelease = func(api.ReleaseRequest) error {
		return errdefs.Errorf(errdefs.CodeNotPrimary, "this instance is standby")
	}
	n.Unlock()
	first, err := m.Destroy(ctx, "sb1")
	if errdefs.CodeOf(err) != errdefs.CodeNotPrimary {
		t.Fatalf("first destroy: %v, want not_primary", err)
	}
	if rec, _ := m.Store.Sandbox(ctx, "sb1"); rec.State != api.StateReleasing {
		t.Fatalf("state after lost release = %s, want releasing", rec.State)
	}
	n.Lock()
	n.FailRelease = nil
	n.Unlock()
	second, err := m.Destroy(ctx, "sb1")
	if err != nil || !second.Reused || second.OperationID != first.OperationID || !second.Verdict.OK() {
		t.Fatalf("retry = %+v, %v; first op %s", second, err, first.OperationID)
	}
	if len(n.ReleaseOps) != 2 || n.ReleaseOps[0] != n.ReleaseOps[1] {
		t.Fatalf("node saw releases %v, want one id twice", n.ReleaseOps)
	}
}

func TestDestroyFencedIsRecordedAsFailed(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	if _, err := m.Create(ctx, "sb1", testSpec()); err != nil {
		t.Fatal(err)
	}
	// Someone else moved the sandbox to generation 2 on the node.
	n.Put(api.Sandbox{ID: "sb1", Generation: 2, State: api.StateReady})
	d, err := m.Destroy(ctx, "sb1")
	var ae *errdefs.Error
	if !errors.As(err, &ae) || ae.Code != errdefs.CodeFenced || !strings.Contains(ae.Message, "current generation is 2") {
		t.Fatalf("destroy = %v, want fenced with the node's message", err)
	}
	op, _ := m.Store.Operation(ctx, d.OperationID)
	if op.State != OpFailed {
		t.Fatalf("operation = %+v, want failed", op)
	}
	if rec, _ := m.Store.Sandbox(ctx, "sb1"); rec.State != api.StateReady {
		t.Fatalf("state = %s, want ready (the release did not happen)", rec.State)
	}
}

func TestConcurrentCreatesShareOneOperation(t *testing.T) {
	ctx := context.Background()
	n := fakenode.New("node-a")
	sock := fakenode.Serve(t, n)
	path := filepath.Join(t.TempDir(), "m.db")
	// Two ctl-manager processes: two store handles on one database.
	var ms []*Manager
	for range 2 {
		st, err := OpenStore(ctx, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		ms = append(ms, &Manager{Store: st, Client: &api.Client{SocketPath: sock}})
	}
	results := make(chan CreateResult, 2)
	errs := make(chan error, 2)
	for _, m := range ms {
		go func() {
			r, err := m.Create(ctx, "sb1", testSpec())
			results <- r
			errs <- err
		}()
	}
	var ops []string
	for range 2 {
		r, err := <-results, <-errs
		switch {
		case err == nil:
			ops = append(ops, r.OperationID)
		case errdefs.CodeOf(err) == errdefs.CodeConflict:
			// The other finished first: the sandbox is ready.
		default:
			t.Fatalf("create: %v", err)
		}
	}
	if len(ops) == 0 || (len(ops) == 2 && ops[0] != ops[1]) {
		t.Fatalf("operation ids %v: want one claim", ops)
	}
	gens, _ := ms[0].Store.Generations(ctx, "sb1")
	if len(gens) != 1 || gens[0].State != api.StateReady {
		t.Fatalf("generations = %+v, want exactly one ready", gens)
	}
}

func TestCreateRetrySendsTheRecordedRequest(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	var seen []api.ClaimRequest
	n.Lock()
	n.FailClaim = func(req api.ClaimRequest) error {
		seen = append(seen, req)
		if len(seen) == 1 {
			return errdefs.Errorf(errdefs.CodeUnavailable, "answer lost")
		}
		return nil
	}
	n.Unlock()
	first := testSpec()
	first.Process.Args = []string{"/bin/sleep", "100"}
	if _, err := m.Create(ctx, "sb1", first); errdefs.CodeOf(err) != errdefs.CodeUnavailable {
		t.Fatalf("first create: %v", err)
	}
	// The operator retries with a different memory size: the pending
	// operation is repeated as recorded, or the node would refuse the
	// reused operation id as a different request.
	second := testSpec()
	second.Resources.MemoryBytes = 512 << 20
	res, err := m.Create(ctx, "sb1", second)
	if err != nil || !res.Reused {
		t.Fatalf("retry = %+v, %v", res, err)
	}
	if len(seen) != 2 || seen[1].Resources.MemoryBytes != 256<<20 || len(seen[1].Process.Args) != 2 || seen[1].OperationID != seen[0].OperationID {
		t.Fatalf("node saw %+v, want the first request twice", seen)
	}
}

func TestNodeKeyPinnedOnFirstContactAndChangeRefused(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	if _, err := m.NodeStatus(ctx); err != nil {
		t.Fatal(err)
	}
	node, err := m.Store.Node(ctx, "node-a")
	if err != nil || !bytes.Equal(node.PublicKey, n.Key.Public().(ed25519.PublicKey)) {
		t.Fatalf("key not pinned at first contact: %+v, %v", node, err)
	}
	_, other, _ := ed25519.GenerateKey(nil)
	n.Lock()
	n.Key = other
	n.Unlock()
	if _, err := m.NodeStatus(ctx); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("contact with a changed node key: %v, want conflict", err)
	}
	if _, err := m.Create(ctx, "sb1", testSpec()); err == nil {
		t.Fatal("create against a node with a changed key succeeded")
	}
}

// TestCreateRetriesBusyAfterHint: a claim the node refused as busy (a
// concurrency limit, with a retry hint) is sent again after the hinted
// wait, with the same operation id, at most BusyRetries times.
func TestCreateRetriesBusyAfterHint(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	busy := 2
	n.Lock()
	n.FailClaim = func(api.ClaimRequest) error {
		if busy > 0 {
			busy--
			return errdefs.Busy(1500*time.Millisecond, "8 claims already running")
		}
		return nil
	}
	n.Unlock()
	var waits []time.Duration
	m.Wait = func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil }
	m.BusyRetries = 0
	res, err := m.Create(ctx, "sb1", testSpec())
	if errdefs.CodeOf(err) != errdefs.CodeUnavailable || errdefs.RetryAfterOf(err) != 2*time.Second || len(waits) != 0 {
		t.Fatalf("without retries: %v (hint %v, waits %v); want busy, 2s hint, no wait", err, errdefs.RetryAfterOf(err), waits)
	}
	m.BusyRetries = 3
	again, err := m.Create(ctx, "sb1", testSpec())
	if err != nil {
		t.Fatalf("create with busy retries: %v", err)
	}
	if fmt.Sprint(waits) != "[2s]" || again.OperationID != res.OperationID {
		t.Fatalf("waits %v, op %s (first %s); want one 2s wait and the same operation id", waits, again.OperationID, res.OperationID)
	}
}

// TestUpdateNetworkRecordsPolicy: after a live update the node accepted,
// the manager's record of the generation holds the new policy (the
// claim's before); an update the node refuses changes nothing.
func TestUpdateNetworkRecordsPolicy(t *testing.T) {
	ctx := context.Background()
	m, _ := setup(t)
	if _, err := m.Create(ctx, "sb1", testSpec()); err != nil {
		t.Fatal(err)
	}
	gen := func() GenerationRecord {
		t.Helper()
		gs, err := m.Store.Generations(ctx, "sb1")
		if err != nil || len(gs) != 1 {
			t.Fatalf("generations %+v, %v", gs, err)
		}
		return gs[0]
	}
	if g := gen(); !reflect.DeepEqual(g.Network, testSpec().Network) {
		t.Fatalf("claimed generation's network %+v, want the spec's %+v", g.Network, testSpec().Network)
	}
	p := api.NetworkPolicy{Mode: api.NetworkRestrict, Rules: []api.NetworkRule{{CIDR: "203.0.113.0/24", Protocol: "tcp", Ports: []string{"443"}}}}
	if _, err := m.UpdateNetwork(ctx, "sb1", p); err != nil {
		t.Fatal(err)
	}
	if g := gen(); !reflect.DeepEqual(g.Network, p) {
		t.Errorf("generation's network after the update %+v, want %+v", g.Network, p)
	}
	// Destroyed: the node refuses an update; the record keeps the last
	// policy in force.
	if _, err := m.Destroy(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.UpdateNetwork(ctx, "sb1", api.NetworkPolicy{Mode: api.NetworkOpen}); err == nil {
		t.Fatal("update of a destroyed sandbox succeeded")
	}
	if g := gen(); !reflect.DeepEqual(g.Network, p) {
		t.Errorf("a refused update changed the record: %+v", g.Network)
	}
}
