package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/ctld/ctld/internal/errdefs"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The journal stores the epoch of the term that owns it. A term takes the
// journal over in one transaction that raises the stored epoch to its own;
// every later write of any handle checks, inside its transaction, that the
// handle's epoch is still the stored one. A writer whose term was superseded
// (a stale primary, or a handle opened with a rolled-back ha/epoch) changes
// nothing.
// Both live in the meta bucket (see index.go).
var (
	keyEpoch     = []byte("epoch")
	keyHeartbeat = []byte("heartbeat")
	// keyWriterEpoch is the last writer epoch handed out (NextWriterEpoch).
	keyWriterEpoch = []byte("writer_epoch")
)

// ErrFenced is the kind of every write refused because the writer's epoch is
// not the journal's current epoch.
var ErrFenced = errors.New("fenced")

// FencedError is a write refused by the epoch check.
type FencedError struct {
	Writer  uint64 // the handle's epoch (0: never took the journal over)
	Current uint64 // the journal's epoch
}

func (e *FencedError) Error() string {
	if e.Writer == 0 {
		return fmt.Sprintf("journal write refused: this handle never took the journal over (journal epoch %d)", e.Current)
	}
	return fmt.Sprintf("journal write refused: writer epoch %d is not the journal's epoch %d (a newer primary took over)", e.Writer, e.Current)
}

// Is makes errors.Is(err, ErrFenced) true.
func (e *FencedError) Is(target error) bool { return target == ErrFenced }

// ErrorCode is its kind at the API edge: a newer primary owns the journal.
func (e *FencedError) ErrorCode() errdefs.Code { return errdefs.CodeFenced }

// ErrEpochBehind means a term tried to take the journal over with an epoch
// that is not above the journal's: the durable ha/epoch file was rolled back
// (restored from a backup, edited), and starting would reuse epochs that
// records and proofs already carry.
var ErrEpochBehind = errors.New("epoch behind the journal")

func storedEpoch(tx *bolt.Tx) uint64 {
	b := tx.Bucket(bucketMeta)
	if b == nil {
		return 0
	}
	v := b.Get(keyEpoch)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// TakeOver makes epoch the journal's current epoch, in one transaction, and
// binds this handle to it. It refuses (ErrEpochBehind, nothing written) if
// the journal already carries epoch or a later one. Call it once per term,
// after the election bumped the durable epoch and before any other write.
func (j *Journal) TakeOver(epoch uint64) error {
	if epoch == 0 {
		return fmt.Errorf("take journal over: epoch 0 is not a term")
	}
	err := j.db.Update(func(tx *bolt.Tx) error {
		prev := storedEpoch(tx)
		if prev == epoch && j.epoch == epoch {
			return nil // this handle already owns the journal for this term
		}
		if epoch <= prev {
			return fmt.Errorf("%w: term epoch %d, journal epoch %d: the ha/epoch file was rolled back; "+
				"refusing to start (set ha/epoch above %d only if you know no other primary runs)", ErrEpochBehind, epoch, prev, prev)
		}
		b, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		return b.Put(keyEpoch, binary.BigEndian.AppendUint64(nil, epoch))
	})
	if err != nil {
		return fmt.Errorf("take journal over at epoch %d: %w", epoch, err)
	}
	j.commits.Add(1)
	j.epoch = epoch
	return nil
}

// Epoch returns the journal's current epoch as stored (not this handle's).
func (j *Journal) Epoch() (uint64, error) {
	var e uint64
	err := j.db.View(func(tx *bolt.Tx) error { e = storedEpoch(tx); return nil })
	return e, err
}

// Heartbeat is a small fenced write: the health check's proof that the
// journal is writable by this term (disk, fsync, epoch).
func (j *Journal) Heartbeat(now time.Time) error {
	return j.Update(func(t *Tx) error {
		b, err := t.tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		return b.Put(keyHeartbeat, binary.BigEndian.AppendUint64(nil, uint64(now.UnixNano())))
	})
}

// fence is the check at the start of every write transaction.
func (j *Journal) fence(tx *bolt.Tx) error {
	if cur := storedEpoch(tx); j.epoch == 0 || cur != j.epoch {
		return &FencedError{Writer: j.epoch, Current: cur}
	}
	return nil
}

// NextWriterEpoch takes a new writer epoch in this transaction: one above
// the last one handed out, by any primary, for any sandbox or generation,
// so a writer epoch only grows and a stale writer can never carry the
// current one.
func (t *Tx) NextWriterEpoch() (uint64, error) {
	b, err := t.tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return 0, err
	}
	var last uint64
	if v := b.Get(keyWriterEpoch); len(v) == 8 {
		last = binary.BigEndian.Uint64(v)
	}
	next := last + 1
	return next, b.Put(keyWriterEpoch, binary.BigEndian.AppendUint64(nil, next))
}
