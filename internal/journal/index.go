package journal

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ctld/ctld/internal/proof"
	bolt "go.etcd.io/bbolt"
)

// Indexes, kept in the same transaction as the records they point to (a
// bbolt transaction is atomic, so a crash leaves both or neither):
//   - live: sandbox id → generation, for every record that is not finished
//     (claiming, ready, releasing, lost, or withheld). Claim admission, the
//     ledger and reconcile read only these, never the history.
//   - pending: operation id → generation, for pending operations.
//   - history: finish time (8 bytes, big-endian unix nanoseconds) + kind +
//     id → generation, one entry per finished record, oldest first, so
//     retention prunes from the front without scanning.
//   - meta: the number of history entries, so a count limit needs no scan.
var (
	bucketLive    = []byte("live")
	bucketPending = []byte("pending")
	bucketHistory = []byte("history")
	bucketMeta    = []byte("meta")

	keyHistoryCount = []byte("history_count")
)

// History entry kinds.
const (
	histSandbox byte = 's'
	histOp      byte = 'o'
	histProof   byte = 'p'
)

// Finished reports whether the record is history: released or failed with
// a clean proof. Anything else (including a state this version does not
// know) is live and counted.
func (s Sandbox) Finished() bool {
	return (s.State == StateReleased || s.State == StateFailed) && !s.Withheld
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func histKey(at time.Time, kind byte, id string) []byte {
	k := binary.BigEndian.AppendUint64(make([]byte, 0, 9+len(id)), uint64(at.UnixNano()))
	return append(append(k, kind), id...)
}

func historyCount(tx *bolt.Tx) uint64 {
	if b := tx.Bucket(bucketMeta).Get(keyHistoryCount); len(b) == 8 {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func setHistoryCount(tx *bolt.Tx, n uint64) error {
	return tx.Bucket(bucketMeta).Put(keyHistoryCount, u64(n))
}

func addHistory(tx *bolt.Tx, at time.Time, kind byte, id string, gen uint64) error {
	h := tx.Bucket(bucketHistory)
	k := histKey(at, kind, id)
	if h.Get(k) != nil {
		return nil
	}
	if err := h.Put(k, u64(gen)); err != nil {
		return err
	}
	return setHistoryCount(tx, historyCount(tx)+1)
}

// indexSandbox updates the indexes for s before it is stored: a finished
// record leaves the live index and enters the history once per generation.
func indexSandbox(tx *bolt.Tx, s Sandbox) error {
	live := tx.Bucket(bucketLive)
	if !s.Finished() {
		return live.Put([]byte(s.ID), u64(s.Generation))
	}
	wasLive := live.Get([]byte(s.ID)) != nil
	if err := live.Delete([]byte(s.ID)); err != nil {
		return err
	}
	add := wasLive
	if !wasLive {
		// Not live before: new in history unless this very generation was
		// already finished (a re-put of a finished record).
		var prev struct {
			Generation uint64 `json:"generation"`
		}
		b := tx.Bucket(bucketSandboxes).Get([]byte(s.ID))
		add = b == nil || json.Unmarshal(b, &prev) != nil || prev.Generation != s.Generation
	}
	if !add {
		return nil
	}
	return addHistory(tx, time.Now(), histSandbox, s.ID, s.Generation)
}

// indexOperation updates the indexes for o before it is stored.
func indexOperation(tx *bolt.Tx, o Operation) error {
	pending := tx.Bucket(bucketPending)
	if o.State == OpPending {
		return pending.Put([]byte(o.ID), u64(o.Generation))
	}
	wasPending := pending.Get([]byte(o.ID)) != nil
	if err := pending.Delete([]byte(o.ID)); err != nil {
		return err
	}
	if !wasPending && tx.Bucket(bucketOperations).Get([]byte(o.ID)) != nil {
		return nil // already finished: in history since then
	}
	return addHistory(tx, time.Now(), histOp, o.ID, o.Generation)
}

// indexProof enters a new proof in the history.
func indexProof(tx *bolt.Tx, p proof.Proof) error {
	if tx.Bucket(bucketProofs).Get([]byte(p.OperationID)) != nil {
		return nil
	}
	return addHistory(tx, time.Now(), histProof, p.OperationID, p.Generation)
}

// buildIndex indexes a journal written before the indexes existed; it runs
// once, in the transaction that creates the index buckets. Existing history
// counts as finished now, so retention keeps it a full window.
func buildIndex(tx *bolt.Tx) error {
	now := time.Now()
	err := tx.Bucket(bucketSandboxes).ForEach(func(k, v []byte) error {
		var s Sandbox
		if err := decode(bucketSandboxes, k, v, &s); err != nil {
			return err
		}
		if !s.Finished() {
			return tx.Bucket(bucketLive).Put(k, u64(s.Generation))
		}
		return addHistory(tx, now, histSandbox, s.ID, s.Generation)
	})
	if err != nil {
		return err
	}
	err = tx.Bucket(bucketOperations).ForEach(func(k, v []byte) error {
		var o Operation
		if err := decode(bucketOperations, k, v, &o); err != nil {
			return err
		}
		if o.State == OpPending {
			return tx.Bucket(bucketPending).Put(k, u64(o.Generation))
		}
		return addHistory(tx, now, histOp, o.ID, o.Generation)
	})
	if err != nil {
		return err
	}
	return tx.Bucket(bucketProofs).ForEach(func(k, _ []byte) error {
		return addHistory(tx, now, histProof, string(k), 0)
	})
}

// LiveSandboxes lists the records that are not finished, ordered by id. It
// reads the live index: its cost grows with the live generations, not with
// the journal's history.
func (t *Tx) LiveSandboxes() ([]Sandbox, error) {
	var out []Sandbox
	err := t.tx.Bucket(bucketLive).ForEach(func(k, _ []byte) error {
		s, ok, err := t.Sandbox(string(k))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("live index names sandbox %s, which has no record", k)
		}
		out = append(out, s)
		return nil
	})
	return out, err
}

// PendingOperations lists the pending operations, from the pending index.
func (t *Tx) PendingOperations() ([]Operation, error) {
	var out []Operation
	err := t.tx.Bucket(bucketPending).ForEach(func(k, _ []byte) error {
		o, ok, err := t.Operation(string(k))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("pending index names operation %s, which has no record", k)
		}
		out = append(out, o)
		return nil
	})
	return out, err
}

// Retention bounds the journal's history: finished sandbox records,
// finished operations (their stored results are what makes a repeated
// operation_id idempotent) and cleanup proofs. A record goes when it is
// older than MaxAge or when more than MaxRecords history records exist
// (oldest first). Zero means no limit of that kind. Live records and
// pending operations are never pruned.
type Retention struct {
	MaxAge     time.Duration
	MaxRecords int
}

// PruneResult says what one Prune call did.
type PruneResult struct {
	Pruned int
	// Early counts records pruned by the record limit while younger than
	// MaxAge: their operation ids lost idempotency before the window.
	Early int
	// More is true when the batch ended with more history to prune.
	More bool
	// Remaining is the number of history records left.
	Remaining uint64
}

// Prune removes at most batch history records that retention r no longer
// keeps, as of now, in one transaction. Callers loop while More, outside any
// request's path, so a large backlog never holds the write lock long.
func (j *Journal) Prune(r Retention, now time.Time, batch int) (PruneResult, error) {
	var res PruneResult
	if batch <= 0 {
		return res, errors.New("prune journal: batch must be positive")
	}
	err := j.db.Update(func(tx *bolt.Tx) error {
		if err := j.fence(tx); err != nil {
			return err
		}
		count := historyCount(tx)
		cutoff := now.Add(-r.MaxAge)
		expired := func(k []byte, count uint64) (due, early bool) {
			old := r.MaxAge > 0 && int64(binary.BigEndian.Uint64(k[:8])) < cutoff.UnixNano()
			over := r.MaxRecords > 0 && count > uint64(r.MaxRecords)
			return old || over, over && !old && r.MaxAge > 0
		}
		// Collect first: deleting under a bbolt cursor can skip keys.
		var keys [][]byte
		c := tx.Bucket(bucketHistory).Cursor()
		n := count
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			due, early := expired(k, n)
			if !due {
				break
			}
			if len(keys) == batch {
				res.More = true
				break
			}
			keys = append(keys, bytes.Clone(k))
			if early {
				res.Early++
			}
			n--
		}
		h := tx.Bucket(bucketHistory)
		for _, k := range keys {
			if len(k) < 9 {
				return fmt.Errorf("prune journal: malformed history key %x", k)
			}
			if err := pruneRecord(tx, k[8], k[9:], h.Get(k)); err != nil {
				return err
			}
			if err := h.Delete(k); err != nil {
				return err
			}
		}
		res.Pruned, res.Remaining = len(keys), count-uint64(len(keys))
		return setHistoryCount(tx, res.Remaining)
	})
	if err != nil {
		return PruneResult{}, fmt.Errorf("prune journal: %w", err)
	}
	j.commits.Add(1)
	return res, nil
}

// pruneRecord deletes the record a history entry points to, if it is still
// the finished one the entry was written for: a sandbox id claimed again
// since, or an operation id reused while pending, stays.
func pruneRecord(tx *bolt.Tx, kind byte, id, val []byte) error {
	switch kind {
	case histSandbox:
		if tx.Bucket(bucketLive).Get(id) != nil {
			return nil
		}
		b := tx.Bucket(bucketSandboxes).Get(id)
		if b == nil {
			return nil
		}
		var s struct {
			Generation uint64 `json:"generation"`
		}
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("decode sandboxes/%s: %w", id, err)
		}
		if len(val) == 8 && s.Generation != binary.BigEndian.Uint64(val) {
			return nil
		}
		return tx.Bucket(bucketSandboxes).Delete(id)
	case histOp:
		if tx.Bucket(bucketPending).Get(id) != nil {
			return nil
		}
		return tx.Bucket(bucketOperations).Delete(id)
	case histProof:
		return tx.Bucket(bucketProofs).Delete(id)
	}
	return fmt.Errorf("unknown history kind %q for %s", kind, id)
}

// CheckIndex verifies that the indexes match the records: every record
// that is not finished is in the live index with its generation and nothing
// else is; the pending index is exactly the pending operations; the history
// count is the number of history entries. It reads everything: for tests
// and diagnosis, not for the request path.
func (j *Journal) CheckIndex() error {
	return j.db.View(func(tx *bolt.Tx) error {
		var errs []error
		live, pending := map[string]uint64{}, map[string]bool{}
		_ = tx.Bucket(bucketLive).ForEach(func(k, v []byte) error {
			live[string(k)] = binary.BigEndian.Uint64(v)
			return nil
		})
		_ = tx.Bucket(bucketPending).ForEach(func(k, _ []byte) error {
			pending[string(k)] = true
			return nil
		})
		ss, err := all[Sandbox](tx, bucketSandboxes)
		if err != nil {
			return err
		}
		for _, s := range ss {
			g, in := live[s.ID]
			switch {
			case !s.Finished() && !in:
				errs = append(errs, fmt.Errorf("sandbox %s (%s) missing from the live index", s.ID, s.State))
			case !s.Finished() && g != s.Generation:
				errs = append(errs, fmt.Errorf("sandbox %s: live index has generation %d, record %d", s.ID, g, s.Generation))
			case s.Finished() && in:
				errs = append(errs, fmt.Errorf("finished sandbox %s (%s) in the live index", s.ID, s.State))
			}
			delete(live, s.ID)
		}
		for id := range live {
			errs = append(errs, fmt.Errorf("live index names sandbox %s, which has no record", id))
		}
		ops, err := all[Operation](tx, bucketOperations)
		if err != nil {
			return err
		}
		for _, o := range ops {
			if (o.State == OpPending) != pending[o.ID] {
				errs = append(errs, fmt.Errorf("operation %s (%s): pending index says %v", o.ID, o.State, pending[o.ID]))
			}
			delete(pending, o.ID)
		}
		for id := range pending {
			errs = append(errs, fmt.Errorf("pending index names operation %s, which has no record", id))
		}
		var n uint64
		_ = tx.Bucket(bucketHistory).ForEach(func(_, _ []byte) error { n++; return nil })
		if c := historyCount(tx); c != n {
			errs = append(errs, fmt.Errorf("history count %d, entries %d", c, n))
		}
		return errors.Join(errs...)
	})
}

// Stats are the journal's record counts, from the indexes (no scan).
type Stats struct {
	Live, Pending int
	History       uint64
}

// Stats reads the record counts.
func (j *Journal) Stats() (Stats, error) {
	var st Stats
	err := j.db.View(func(tx *bolt.Tx) error {
		st.Live = tx.Bucket(bucketLive).Stats().KeyN
		st.Pending = tx.Bucket(bucketPending).Stats().KeyN
		st.History = historyCount(tx)
		return nil
	})
	return st, err
}
