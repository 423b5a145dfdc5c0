// Package journal is ctld's durable record of intent (bbolt in the state
// dir). Every kernel effect is written as *intended* before it is made and
// *done* after, each with the epoch of the primary that wrote it; sandbox
// records, operation results (for idempotency across failover), cleanup
// proofs and withheld capacity live beside them. The journal says what ctld
// meant to do; the kernel decides what exists (see the reconciler).
package journal

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/ctld/ctld/internal/api"
	bolt "go.etcd.io/bbolt"
)

var (
	bucketEffects    = []byte("effects")
	bucketSandboxes  = []byte("sandboxes")
	bucketOperations = []byte("operations")
	bucketProofs     = []byte("proofs")
)

// Effect kinds: one per kind of kernel object ctld makes.
const (
	KindCgroup = "cgroup"
	KindMount  = "mount"
	KindNetns  = "netns"
	KindBundle = "bundle"
	KindRunsc  = "runsc"
	// KindLogs is a generation's log directory (guestlog): made first,
	// removed last, after the lease cgroup (and the log writer in it).
	KindLogs = "logs"
	KindDisk = "disk" // the project quota that bounds a generation's scratch dir
)

// Effect states.
const (
	Intended = "intended"
	Done     = "done"
	Removing = "removing"
)

// Effect is one kernel object ctld made or is about to make.
type Effect struct {
	Kind       string    `json:"kind"`
	Name       string    `json:"name"`
	SandboxID  string    `json:"sandbox_id"`
	Generation uint64    `json:"generation"`
	State      string    `json:"state"`
	Epoch      uint64    `json:"epoch"`
	Updated    time.Time `json:"updated"`
}

func (e Effect) key() []byte { return []byte(e.Kind + "/" + e.Name) }

// Sandbox is the node's record of a sandbox and its current generation.
type Sandbox struct {
	api.Sandbox
	ClaimOp   string            `json:"claim_op"`
	ReleaseOp string            `json:"release_op,omitempty"`
	Nonce     string            `json:"nonce"`
	Netns     string            `json:"netns"`
	Root      string            `json:"root"`
	Bundle    string            `json:"bundle"`
	Request   *api.ClaimRequest `json:"request,omitempty"`
	// Withheld is set when cleanup of this generation could not be proven:
	// its capacity stays out until an operator or a later proof clears it.
	Withheld bool `json:"withheld,omitempty"`
	// ProofOp is the operation id the latest cleanup proof of this
	// generation is stored under.
	ProofOp string `json:"proof_op,omitempty"`
	// Kernel identities of the generation's objects, recorded once made,
	// so the cleanup proof checks the objects and not only their names:
	// the overlay's superblock (major:minor) and the netns (nsfs device,
	// inode, cookie).
	RootDev     string `json:"root_dev,omitempty"`
	NetnsDev    uint64 `json:"netns_dev,omitempty"`
	NetnsIno    uint64 `json:"netns_ino,omitempty"`
	NetnsCookie uint64 `json:"netns_cookie,omitempty"`
	// Retries of a withheld generation's teardown (see node/withheld.go).
	RetryAttempts int       `json:"retry_attempts,omitempty"`
	RetryLast     time.Time `json:"retry_last,omitzero"`
	RetryNext     time.Time `json:"retry_next,omitzero"`
	// DiskProject is the project id whose quota bounds the generation's
	// scratch dir (0: none, a record from before disk leases).
	DiskProject uint32 `json:"disk_project,omitempty"`
}

// Holds reports whether the record still holds leased capacity: a live or
// half-done generation does until a clean cleanup proof ends it; one whose
// cleanup is unproven moved to the withheld ledger instead.
func (s Sandbox) Holds() bool {
	switch s.State {
	case api.StateClaiming, api.StateReady, api.StateReleasing, api.StateLost:
		return !s.Withheld
	}
	return false
}

// Operation is a mutating call's record, keyed by its operation_id.
type Operation struct {
	ID          string          `json:"id"`
	Kind        string          `json:"kind"` // claim | release
	SandboxID   string          `json:"sandbox_id"`
	Generation  uint64          `json:"generation"`
	RequestHash string          `json:"request_hash"`
	State       string          `json:"state"` // pending | done | failed
	Result      json.RawMessage `json:"result,omitempty"`
	Error       *api.ErrorBody  `json:"error,omitempty"`
	Epoch       uint64          `json:"epoch"`
	Created     time.Time       `json:"created"`
}

// Operation states.
const (
	OpPending = "pending"
	OpDone    = "done"
	OpFailed  = "failed"
)

// Journal is the bbolt database, bound to the epoch of the term that took
// it over (see TakeOver); writes of a handle that did not are refused.
type Journal struct {
	db    *bolt.DB
	epoch uint64
}

// Open opens (creating if needed) the journal at path. bbolt takes its own
// flock, so only one process holds it open; timeout bounds the wait for it
// (0 would wait forever behind a wedged holder). Call TakeOver before any
// write.
func Open(path string, timeout time.Duration) (*Journal, error) {
	if timeout <= 0 {
		return nil, fmt.Errorf("open journal %s: a positive timeout is required", path)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout})
	if err != nil {
		return nil, fmt.Errorf("open journal %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		unindexed := tx.Bucket(bucketLive) == nil
		for _, b := range [][]byte{bucketEffects, bucketSandboxes, bucketOperations, bucketProofs, bucketLive, bucketPending, bucketHistory, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if unindexed {
			return buildIndex(tx)
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init journal %s: %w", path, err)
	}
	return &Journal{db: db}, nil
}

// Close closes the database.
func (j *Journal) Close() error { return j.db.Close() }

// Tx is a read-write view used to change several records atomically.
type Tx struct{ tx *bolt.Tx }

// Update runs fn in one durable transaction, after checking inside it that
// this handle's epoch is the journal's current epoch (else a *FencedError
// and nothing is written).
func (j *Journal) Update(fn func(*Tx) error) error {
	return j.db.Update(func(tx *bolt.Tx) error {
		if err := j.fence(tx); err != nil {
			return err
		}
		return fn(&Tx{tx})
	})
}

// View runs fn in a read-only transaction.
func (j *Journal) View(fn func(*Tx) error) error {
	return j.db.View(func(tx *bolt.Tx) error { return fn(&Tx{tx}) })
}

func put(tx *bolt.Tx, bucket []byte, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s/%s: %w", bucket, key, err)
	}
	return tx.Bucket(bucket).Put([]byte(key), b)
}

func get(tx *bolt.Tx, bucket []byte, key string, v any) (bool, error) {
	b := tx.Bucket(bucket).Get([]byte(key))
	if b == nil {
		return false, nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("decode %s/%s: %w", bucket, key, err)
	}
	return true, nil
}

func all[T any](tx *bolt.Tx, bucket []byte) ([]T, error) {
	var out []T
	err := tx.Bucket(bucket).ForEach(func(k, v []byte) error {
		var t T
		if err := json.Unmarshal(v, &t); err != nil {
			return fmt.Errorf("decode %s/%s: %w", bucket, k, err)
		}
		out = append(out, t)
		return nil
	})
	return out, err
}

// PutEffect records an effect in its current state.
func (t *Tx) PutEffect(e Effect) error {
	e.Updated = time.Now().UTC()
	return put(t.tx, bucketEffects, string(e.key()), e)
}

// DeleteEffect forgets an effect whose object is gone.
func (t *Tx) DeleteEffect(kind, name string) error {
	return t.tx.Bucket(bucketEffects).Delete([]byte(kind + "/" + name))
}

// Effect reads the effect record of one object.
func (t *Tx) Effect(kind, name string) (Effect, bool, error) {
	var e Effect
	ok, err := get(t.tx, bucketEffects, kind+"/"+name, &e)
	return e, ok, err
}

// Effects lists all effects, ordered by kind and name.
func (t *Tx) Effects() ([]Effect, error) { return all[Effect](t.tx, bucketEffects) }

// PutSandbox stores a sandbox record (and indexes it: see index.go).
func (t *Tx) PutSandbox(s Sandbox) error {
	if err := indexSandbox(t.tx, s); err != nil {
		return fmt.Errorf("index sandbox %s: %w", s.ID, err)
	}
	return put(t.tx, bucketSandboxes, s.ID, s)
}

// Sandbox reads a sandbox record.
func (t *Tx) Sandbox(id string) (Sandbox, bool, error) {
	var s Sandbox
	ok, err := get(t.tx, bucketSandboxes, id, &s)
	return s, ok, err
}

// Sandboxes lists all sandbox records, history included, ordered by id.
// Hot paths use LiveSandboxes.
func (t *Tx) Sandboxes() ([]Sandbox, error) {
	ss, err := all[Sandbox](t.tx, bucketSandboxes)
	sort.Slice(ss, func(i, k int) bool { return ss[i].ID < ss[k].ID })
	return ss, err
}

// PutOperation stores an operation record (and indexes it).
func (t *Tx) PutOperation(o Operation) error {
	if err := indexOperation(t.tx, o); err != nil {
		return fmt.Errorf("index operation %s: %w", o.ID, err)
	}
	return put(t.tx, bucketOperations, o.ID, o)
}

// Operation reads an operation record.
func (t *Tx) Operation(id string) (Operation, bool, error) {
	var o Operation
	ok, err := get(t.tx, bucketOperations, id, &o)
	return o, ok, err
}

// Operations lists all operation records, history included. Hot paths use
// PendingOperations.
func (t *Tx) Operations() ([]Operation, error) { return all[Operation](t.tx, bucketOperations) }

// PutProof stores a cleanup proof under its operation id (and indexes it).
func (t *Tx) PutProof(p api.CleanupProof) error {
	if err := indexProof(t.tx, p); err != nil {
		return fmt.Errorf("index proof %s: %w", p.OperationID, err)
	}
	return put(t.tx, bucketProofs, p.OperationID, p)
}

// Proof reads a cleanup proof.
func (t *Tx) Proof(opID string) (api.CleanupProof, bool, error) {
	var p api.CleanupProof
	ok, err := get(t.tx, bucketProofs, opID, &p)
	return p, ok, err
}

// ErrNotFound is returned by lookups that must find their record.
var ErrNotFound = errors.New("not found")
