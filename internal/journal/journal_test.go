package journal

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/proof"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// newTaken opens a fresh journal taken over at epoch 1.
func newTaken(t *testing.T) *Journal {
	t.Helper()
	j := openTest(t, filepath.Join(t.TempDir(), "journal.db"))
	if err := j.TakeOver(1); err != nil {
		t.Fatal(err)
	}
	return j
}

func mustUpdate(t *testing.T, j *Journal, fn func(*Tx) error) {
	t.Helper()
	if err := j.Update(fn); err != nil {
		t.Fatal(err)
	}
}

func mustView(t *testing.T, j *Journal, fn func(*Tx) error) {
	t.Helper()
	if err := j.View(fn); err != nil {
		t.Fatal(err)
	}
}

func TestOpenNeedsTimeoutAndCreatesBuckets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	if _, err := Open(path, 0); err == nil {
		t.Fatal("Open with no timeout succeeded: it could wait forever behind a holder")
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused Open created the file: %v", err)
	}
	j := openTest(t, path)
	if err := j.db.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketEffects, bucketSandboxes, bucketOperations, bucketProofs, bucketLive, bucketPending, bucketHistory, bucketMeta} {
			if tx.Bucket(b) == nil {
				return errors.New("missing bucket " + string(b))
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("journal file mode = %v, %v; want 0600 (it holds operation results)", st.Mode(), err)
	}
	// Reading an empty journal finds nothing, without an error.
	mustView(t, j, func(tx *Tx) error {
		if _, ok, err := tx.Sandbox("x"); ok || err != nil {
			t.Errorf("Sandbox(x) on an empty journal = %v, %v", ok, err)
		}
		if _, ok, err := tx.Operation("x"); ok || err != nil {
			t.Errorf("Operation(x) on an empty journal = %v, %v", ok, err)
		}
		if _, ok, err := tx.Proof("x"); ok || err != nil {
			t.Errorf("Proof(x) on an empty journal = %v, %v", ok, err)
		}
		es, err := tx.Effects()
		if len(es) != 0 || err != nil {
			t.Errorf("Effects() on an empty journal = %v, %v", es, err)
		}
		return nil
	})
}

// TestCommitsCounts: Commits counts committed write transactions only.
func TestCommitsCounts(t *testing.T) {
	j := newTaken(t)
	if c := j.Commits(); c != 1 {
		t.Fatalf("after TakeOver: %d commits, want 1", c)
	}
	mustUpdate(t, j, func(tx *Tx) error { return tx.PutSandbox(Sandbox{ID: "a", Generation: 1}) })
	_ = j.Update(func(*Tx) error { return errors.New("rolled back") })
	mustView(t, j, func(*Tx) error { return nil })
	if c := j.Commits(); c != 2 {
		t.Fatalf("after one Update, one failed Update and a View: %d commits, want 2", c)
	}
}

func TestUpdateIsAtomicAndViewReadOnly(t *testing.T) {
	j := newTaken(t)
	boom := errors.New("boom")
	err := j.Update(func(tx *Tx) error {
		if err := tx.PutSandbox(Sandbox{ID: "a", Generation: 1, State: StateClaiming}); err != nil {
			return err
		}
		if err := tx.PutEffect(Effect{Kind: KindCgroup, Name: "a-g1", State: Intended}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update = %v, want the function's error", err)
	}
	mustView(t, j, func(tx *Tx) error {
		if _, ok, _ := tx.Sandbox("a"); ok {
			t.Error("a failed Update left its sandbox record")
		}
		if es, _ := tx.Effects(); len(es) != 0 {
			t.Errorf("a failed Update left effects %v", es)
		}
		return nil
	})
	if err := j.View(func(tx *Tx) error { return tx.PutSandbox(Sandbox{ID: "v"}) }); err == nil {
		t.Fatal("a write inside View succeeded")
	}
}

func TestSandboxRecords(t *testing.T) {
	j := newTaken(t)
	recs := []Sandbox{
		{ID: "b", Generation: 1, State: StateReady, ClaimOp: "c-b", Netns: "b-g1"},
		{ID: "a", Generation: 3, State: StateReleased, ReleaseOp: "r-a"},
		{ID: "c", Generation: 2, State: StateReleasing, Withheld: true},
	}
	mustUpdate(t, j, func(tx *Tx) error {
		for _, s := range recs {
			if err := tx.PutSandbox(s); err != nil {
				return err
			}
		}
		return nil
	})
	mustView(t, j, func(tx *Tx) error {
		for _, want := range recs {
			want.RecordVersion = RecordVersion // PutSandbox stamps it
			got, ok, err := tx.Sandbox(want.ID)
			if err != nil || !ok || !reflect.DeepEqual(got, want) {
				t.Errorf("Sandbox(%s) = %+v, %v, %v; want %+v", want.ID, got, ok, err, want)
			}
		}
		all, err := tx.Sandboxes()
		if err != nil || len(all) != 3 || all[0].ID != "a" || all[1].ID != "b" || all[2].ID != "c" {
			t.Errorf("Sandboxes() = %+v, %v; want a, b, c in id order", all, err)
		}
		return nil
	})
	// A put replaces the record of the same id.
	mustUpdate(t, j, func(tx *Tx) error {
		return tx.PutSandbox(Sandbox{ID: "b", Generation: 2, State: StateClaiming})
	})
	mustView(t, j, func(tx *Tx) error {
		got, _, _ := tx.Sandbox("b")
		if got.Generation != 2 || got.State != StateClaiming || got.ClaimOp != "" {
			t.Errorf("replaced record = %+v", got)
		}
		return nil
	})
}

func TestHoldsAndFinished(t *testing.T) {
	for _, c := range []struct {
		state          State
		withheld       bool
		holds, finshed bool
	}{
		{StateClaiming, false, true, false},
		{StateReady, false, true, false},
		{StateReleasing, false, true, false},
		{StateLost, false, true, false},
		{StateReleased, false, false, true},
		{StateFailed, false, false, true},
		{StateReady, true, false, false},
		{StateReleased, true, false, false},
		{"a-state-of-a-newer-version", false, false, false},
	} {
		s := Sandbox{State: c.state, Withheld: c.withheld}
		if s.Holds() != c.holds || s.Finished() != c.finshed {
			t.Errorf("%s withheld=%v: Holds %v Finished %v, want %v %v", c.state, c.withheld, s.Holds(), s.Finished(), c.holds, c.finshed)
		}
	}
}

func TestOperationRecords(t *testing.T) {
	j := newTaken(t)
	at := time.Date(2026, 11, 30, 13, 0, 0, 0, time.UTC)
	ops := []Operation{
		{ID: "c1", Kind: "claim", SandboxID: "a", Generation: 1, RequestHash: "h1", State: OpPending, Epoch: 1, Created: at},
		{ID: "r1", Kind: "release", SandboxID: "a", Generation: 1, RequestHash: "h2", State: OpDone, Result: json.RawMessage(`{"ok":true}`), Epoch: 1, Created: at},
		{ID: "c2", Kind: "claim", SandboxID: "b", Generation: 1, State: OpFailed, Error: &OpError{Code: "conflict", Message: "taken"}, Epoch: 1, Created: at},
	}
	mustUpdate(t, j, func(tx *Tx) error {
		for _, o := range ops {
			if err := tx.PutOperation(o); err != nil {
				return err
			}
		}
		return nil
	})
	mustView(t, j, func(tx *Tx) error {
		for _, want := range ops {
			want.RecordVersion = RecordVersion // PutOperation stamps it
			got, ok, err := tx.Operation(want.ID)
			if err != nil || !ok || !reflect.DeepEqual(got, want) {
				t.Errorf("Operation(%s) = %+v, %v, %v; want %+v", want.ID, got, ok, err, want)
			}
		}
		all, err := tx.Operations()
		if err != nil || len(all) != 3 {
			t.Errorf("Operations() = %d records, %v", len(all), err)
		}
		pending, err := tx.PendingOperations()
		if err != nil || len(pending) != 1 || pending[0].ID != "c1" {
			t.Errorf("PendingOperations() = %+v, %v; want c1", pending, err)
		}
		return nil
	})
}

func TestEffectRecords(t *testing.T) {
	j := newTaken(t)
	before := time.Now().UTC()
	mustUpdate(t, j, func(tx *Tx) error {
		for _, e := range []Effect{
			{Kind: KindNetns, Name: "a-g1", SandboxID: "a", Generation: 1, State: Intended, Epoch: 1},
			{Kind: KindCgroup, Name: "b-g1", SandboxID: "b", Generation: 1, State: Done, Epoch: 1},
			{Kind: KindCgroup, Name: "a-g1", SandboxID: "a", Generation: 1, State: Removing, Epoch: 1},
		} {
			if err := tx.PutEffect(e); err != nil {
				return err
			}
		}
		return nil
	})
	keys := func() []string {
		var out []string
		mustView(t, j, func(tx *Tx) error {
			es, err := tx.Effects()
			for _, e := range es {
				out = append(out, string(e.Kind)+"/"+e.Name+":"+string(e.State))
				if e.RecordVersion != RecordVersion {
					t.Errorf("effect %s/%s has record version %d, want %d", e.Kind, e.Name, e.RecordVersion, RecordVersion)
				}
				if e.Updated.Before(before) || e.Updated.Location() != time.UTC {
					t.Errorf("effect %s/%s updated %v: PutEffect must stamp it now, in UTC", e.Kind, e.Name, e.Updated)
				}
			}
			return err
		})
		return out
	}
	if got, want := keys(), []string{"cgroup/a-g1:removing", "cgroup/b-g1:done", "netns/a-g1:intended"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Effects() = %v, want %v (ordered by kind and name)", got, want)
	}
	// The same kind and name is one record: a new state replaces the old.
	mustUpdate(t, j, func(tx *Tx) error {
		return tx.PutEffect(Effect{Kind: KindNetns, Name: "a-g1", SandboxID: "a", Generation: 1, State: Done, Epoch: 1})
	})
	mustUpdate(t, j, func(tx *Tx) error {
		if err := tx.DeleteEffect(KindCgroup, "a-g1"); err != nil {
			return err
		}
		return tx.DeleteEffect(KindMount, "never-made") // deleting nothing is not an error
	})
	if got, want := keys(), []string{"cgroup/b-g1:done", "netns/a-g1:done"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after replace and delete: %v, want %v", got, want)
	}
}

func TestProofRecords(t *testing.T) {
	j := newTaken(t)
	p := proof.Proof{
		OperationID: "r1", NodeID: "n", BootID: "b", Epoch: 1, SandboxID: "a", Generation: 1, LeaseID: "a-g1",
		Checks: []proof.Check{{Name: "cgroup_removed", OK: true}, {Name: "netns_gone", Detail: "held by 42"}},
		Time:   time.Date(2026, 11, 30, 13, 0, 0, 5, time.UTC), NodeKey: []byte{1}, Signature: []byte{2},
	}
	mustUpdate(t, j, func(tx *Tx) error { return tx.PutProof(p) })
	mustView(t, j, func(tx *Tx) error {
		got, ok, err := tx.Proof("r1")
		if err != nil || !ok || !reflect.DeepEqual(got, p) {
			t.Errorf("Proof(r1) = %+v, %v, %v; want %+v", got, ok, err, p)
		}
		return nil
	})
	// Storing the same proof again (a retried release) keeps one history
	// entry.
	mustUpdate(t, j, func(tx *Tx) error { return tx.PutProof(p) })
	if err := j.CheckIndex(); err != nil {
		t.Fatal(err)
	}
	if st, err := j.Stats(); err != nil || st.History != 1 {
		t.Fatalf("stats after storing a proof twice = %+v, %v; want 1 history entry", st, err)
	}
}

func TestClosedJournalRefuses(t *testing.T) {
	j := newTaken(t)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := j.Update(func(*Tx) error { return nil }); !errors.Is(err, berrors.ErrDatabaseNotOpen) {
		t.Errorf("Update on a closed journal = %v, want ErrDatabaseNotOpen", err)
	}
	if err := j.View(func(*Tx) error { return nil }); !errors.Is(err, berrors.ErrDatabaseNotOpen) {
		t.Errorf("View on a closed journal = %v, want ErrDatabaseNotOpen", err)
	}
	if _, err := j.Epoch(); err == nil {
		t.Error("Epoch on a closed journal succeeded")
	}
	if err := j.TakeOver(2); err == nil {
		t.Error("TakeOver on a closed journal succeeded")
	}
}

// putRaw writes records as bytes, the way an older ctld left them.
func putRaw(t *testing.T, path string, recs map[string]map[string][]byte) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for name, kv := range recs {
			b, err := tx.CreateBucketIfNotExists([]byte(name))
			if err != nil {
				return err
			}
			for k, v := range kv {
				if err := b.Put([]byte(k), v); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A journal written before records had their own types (testdata/v0-*.json:
// the encoding of that version, every field set) still decodes, field for
// field: nodes upgrade in place over their journal.
func TestDecodesVersion0Records(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	putRaw(t, path, map[string]map[string][]byte{
		"sandboxes":  {"sb-1": readTestdata(t, "v0-sandbox.json")},
		"operations": {"claim-1": readTestdata(t, "v0-operation.json")},
		"effects":    {"netns/sb-1-g2": readTestdata(t, "v0-effect.json")},
		"proofs":     {"release-1": readTestdata(t, "v0-proof.json")},
	})
	j := openTest(t, path)
	at := time.Date(2026, 11, 30, 13, 0, 0, 123456789, time.UTC)
	res := Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PIDs: 128, Cpuset: "0-1", DiskBytes: 1 << 30}
	root := RootFS{Mode: "overlay", Template: "busybox"}
	wantSandbox := Sandbox{
		ID: "sb-1", Generation: 2, State: "ready", ContainerID: "sb-1-g2", LeaseID: "sb-1-g2",
		Resources: res, RootFS: root, Epoch: 7, CreatedAt: at,
		Timings: Timings{AdmitMS: 1, LeaseMS: 2, RootFSMS: 3, NetworkMS: 4, RunscMS: 5, ProofMS: 6, TotalMS: 21},
		Reason:  "claimed", OOMKills: 3,
		ClaimOp: "claim-1", ReleaseOp: "release-1", Nonce: "00112233", Netns: "sb-1-g2", Root: "/s/root", Bundle: "/r/b",
		Request: &ClaimRequest{
			OperationID: "claim-1", Generation: 2, RootFS: root, Resources: res,
			Network:        NetworkPolicy{Mode: "deny_all"},
			Process:        Process{Args: []string{"/bin/sleep", "1"}, Env: []string{"PATH=/bin"}, Cwd: "/", UID: 1000, GID: 1001},
			MaxLifetimeSec: 3600,
		},
		Withheld: true, ProofOp: "release-1", RootDev: "0:52", NetnsDev: 4, NetnsIno: 4026532000,
		NetnsCookie: 9, RetryAttempts: 2, RetryLast: at, RetryNext: at.Add(time.Minute), DiskProject: 1234,
	}
	wantOp := Operation{ID: "claim-1", Kind: "claim", SandboxID: "sb-1", Generation: 2, RequestHash: "abc", State: "failed",
		Result: json.RawMessage(`{"x":1}`), Error: &OpError{Code: "conflict", Message: "no"}, Epoch: 7, Created: at}
	wantEffect := Effect{Kind: "netns", Name: "sb-1-g2", SandboxID: "sb-1", Generation: 2, State: "done", Epoch: 7, Updated: at}
	wantProof := proof.Proof{OperationID: "release-1", NodeID: "n", BootID: "b", Epoch: 7, SandboxID: "sb-1", Generation: 2,
		LeaseID: "sb-1-g2", Checks: []proof.Check{{Name: "cgroup_removed", OK: true}, {Name: "netns_gone", Detail: "held by 12"}},
		Time: at, NodeKey: []byte{1, 2}, Signature: []byte{3, 4}}
	mustView(t, j, func(tx *Tx) error {
		s, ok, err := tx.Sandbox("sb-1")
		if err != nil || !ok || !reflect.DeepEqual(s, wantSandbox) {
			t.Errorf("sandbox:\n got %+v, %v, %v\nwant %+v", s, ok, err, wantSandbox)
		}
		o, ok, err := tx.Operation("claim-1")
		// Result is raw JSON: compare it compacted.
		if err == nil && ok {
			var c json.RawMessage
			if c, err = compact(o.Result); err == nil {
				o.Result = c
			}
		}
		if err != nil || !ok || !reflect.DeepEqual(o, wantOp) {
			t.Errorf("operation:\n got %+v, %v, %v\nwant %+v", o, ok, err, wantOp)
		}
		es, err := tx.Effects()
		if err != nil || len(es) != 1 || !reflect.DeepEqual(es[0], wantEffect) {
			t.Errorf("effects:\n got %+v, %v\nwant [%+v]", es, err, wantEffect)
		}
		p, ok, err := tx.Proof("release-1")
		if err != nil || !ok || !reflect.DeepEqual(p, wantProof) {
			t.Errorf("proof:\n got %+v, %v, %v\nwant %+v", p, ok, err, wantProof)
		}
		return nil
	})
}

func compact(b []byte) (json.RawMessage, error) {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// Each record says its version, and a record of a newer version (a
// downgraded ctld reading a newer journal) is refused, not half read.
func TestRecordVersions(t *testing.T) {
	j := newTaken(t)
	mustUpdate(t, j, func(tx *Tx) error {
		if err := tx.PutSandbox(Sandbox{ID: "a", Generation: 1, State: StateReady}); err != nil {
			return err
		}
		if err := tx.PutOperation(Operation{ID: "o", Kind: OpClaim, State: OpPending}); err != nil {
			return err
		}
		return tx.PutEffect(Effect{Kind: KindCgroup, Name: "a-g1", State: Done})
	})
	if err := j.db.View(func(tx *bolt.Tx) error {
		for _, kv := range [][2]string{{"sandboxes", "a"}, {"operations", "o"}, {"effects", "cgroup/a-g1"}} {
			var head struct {
				RecordVersion *int `json:"record_version"`
			}
			if err := json.Unmarshal(tx.Bucket([]byte(kv[0])).Get([]byte(kv[1])), &head); err != nil {
				return err
			}
			if head.RecordVersion == nil || *head.RecordVersion != RecordVersion {
				t.Errorf("%s/%s written without record_version %d", kv[0], kv[1], RecordVersion)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "newer.db")
	putRaw(t, path, map[string]map[string][]byte{
		"sandboxes":  {"n": []byte(`{"record_version":2,"id":"n","generation":1,"state":"ready"}`)},
		"operations": {"o": []byte(`{"record_version":2,"id":"o","state":"done"}`)},
		"effects":    {"cgroup/n-g1": []byte(`{"record_version":2,"kind":"cgroup","name":"n-g1","state":"done"}`)},
	})
	n, err := Open(path, time.Second)
	if !errors.Is(err, ErrNewerRecord) {
		// Opening an unindexed journal reads every record to index it.
		t.Fatalf("Open over newer records = %v, want ErrNewerRecord", err)
	}
	if n != nil {
		n.Close()
	}
}

// The journal stores the proof record itself: a signed proof read back
// still verifies, whatever the API's JSON of it looks like.
func TestStoredProofStillVerifies(t *testing.T) {
	j := newTaken(t)
	seed := make([]byte, ed25519.SeedSize)
	id := proof.Identity{NodeID: "0123456789abcdef0123456789abcdef", BootID: "b", Key: ed25519.NewKeyFromSeed(seed)}
	p := proof.Proof{
		OperationID: "r1", NodeID: id.NodeID, BootID: id.BootID, Epoch: 1, SandboxID: "a", Generation: 1, LeaseID: "a-g1",
		Checks: []proof.Check{{Name: "cgroup_removed", OK: true}}, Clean: true, Time: time.Now(),
	}
	if err := proof.Sign(id, &p); err != nil {
		t.Fatal(err)
	}
	mustUpdate(t, j, func(tx *Tx) error { return tx.PutProof(p) })
	mustView(t, j, func(tx *Tx) error {
		got, ok, err := tx.Proof("r1")
		if err != nil || !ok {
			t.Fatalf("Proof(r1) = %v, %v", ok, err)
		}
		if got.Version != proof.Version {
			t.Errorf("stored proof lost its version: %d", got.Version)
		}
		if err := proof.Verify(got, id.PublicKey()); err != nil {
			t.Errorf("stored proof: %v", err)
		}
		return nil
	})
}
