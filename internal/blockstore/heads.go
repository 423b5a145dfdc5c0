package blockstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Head is a volume's published head: the generation a resume starts from.
// Heads are numbered: publishing creates head Seq+1, once (the store's
// create-only Put is the compare-and-swap), so a volume's head is the
// highest-numbered head object it has.
type Head struct {
	Seq         uint64 // 1, 2, ... per volume; 0 = no head
	Generation  uint64 // the committed generation of the volume it names
	WriterEpoch uint64 // the epoch of the writer that sealed it
	Node        string // the node that published it
}

// ErrFenced: a Publish lost its compare-and-swap (the head moved, the
// writer's epoch is older than the head's, the generation is not
// committed, or the volume is deleted). Nothing was changed.
var ErrFenced = errors.New("fenced")

// MaxNodeLen bounds Head.Node.
const MaxNodeLen = 255

// Head objects of a volume v: v/head/<seq, 20 digits>, sealed under v's
// data key, payload (big-endian):
//
//	"CTBH" | version 1 | str volume | u64 seq | u64 generation | u64 writer epoch | str node
//
// The payload repeats the volume and seq its key names, so a head copied
// to another name (another seq, another volume) is ErrCorrupt even before
// the AEAD, which binds the key too.
const (
	headMagic   = "CTBH"
	headVersion = 1
)

func headPrefix(v Volume) string { return v.String() + "/head/" }

func headKey(v Volume, seq uint64) string { return fmt.Sprintf("%s%020d", headPrefix(v), seq) }

func encodeHead(v Volume, h Head) []byte {
	var e encoder
	e.raw([]byte(headMagic))
	e.u8(headVersion)
	e.str(v.String())
	e.u64(h.Seq)
	e.u64(h.Generation)
	e.u64(h.WriterEpoch)
	e.str(h.Node)
	return e.bytes()
}

func decodeHead(v Volume, seq uint64, b []byte) (Head, error) {
	d := decoder{b: b}
	if string(d.raw(len(headMagic))) != headMagic || d.u8() != headVersion {
		return Head{}, errors.New("bad magic or version")
	}
	vol := d.str()
	h := Head{Seq: d.u64(), Generation: d.u64(), WriterEpoch: d.u64(), Node: d.str()}
	if d.err != nil {
		return Head{}, d.err
	}
	if d.rest() != 0 {
		return Head{}, fmt.Errorf("%d trailing bytes", d.rest())
	}
	if vol != v.String() || h.Seq != seq {
		return Head{}, fmt.Errorf("it is head %d of %s", h.Seq, vol)
	}
	return h, nil
}

// headSeqs lists the seqs of v's head objects, ascending.
func (r *Repo) headSeqs(ctx context.Context, v Volume) ([]uint64, error) {
	keys, err := r.store.List(ctx, headPrefix(v))
	if err != nil {
		return nil, fmt.Errorf("list heads of %s: %w", v, err)
	}
	seqs := make([]uint64, 0, len(keys))
	for _, k := range keys {
		s := strings.TrimPrefix(k, headPrefix(v))
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || len(s) != 20 || n == 0 {
			return nil, fmt.Errorf("list heads of %s: %w: stray object %s", v, ErrCorrupt, k)
		}
		seqs = append(seqs, n)
	}
	return seqs, nil // List is sorted, and the names are fixed-width
}

// readHead loads and authenticates head seq of v.
func (r *Repo) readHead(ctx context.Context, v Volume, seq uint64) (Head, error) {
	key := headKey(v, seq)
	blob, err := r.store.Get(ctx, key)
	if err != nil {
		return Head{}, fmt.Errorf("head %d of %s: %w", seq, v, err)
	}
	dk, err := r.keys.Get(ctx, v)
	if err != nil {
		return Head{}, fmt.Errorf("head %d of %s: %w", seq, v, err)
	}
	payload, err := r.codec.open(dk, kindHead, key, blob)
	if err != nil {
		return Head{}, fmt.Errorf("head %d of %s: %w", seq, v, err)
	}
	h, err := decodeHead(v, seq, payload)
	if err != nil {
		return Head{}, fmt.Errorf("head %d of %s: %w: %v", seq, v, ErrCorrupt, err)
	}
	return h, nil
}

// Head returns v's published head: the zero Head (Seq 0) when it has
// none. A head object that fails authentication is ErrCorrupt, never a
// head.
func (r *Repo) Head(ctx context.Context, v Volume) (Head, error) {
	if err := v.Check(); err != nil {
		return Head{}, err
	}
	// A superseded head can vanish between List and Get (GC frees it once
	// a newer one exists): list again, the newer one is there.
	for attempt := 0; ; attempt++ {
		seqs, err := r.headSeqs(ctx, v)
		if err != nil || len(seqs) == 0 {
			return Head{}, err
		}
		h, err := r.readHead(ctx, v, seqs[len(seqs)-1])
		if errors.Is(err, ErrNotFound) && attempt < 3 {
			continue
		}
		return h, err
	}
}

// Publish makes next the volume's head iff the current head is expect
// (compared by Seq; the zero Head = no head yet), next.WriterEpoch is at
// least the current head's WriterEpoch, next.Generation is a committed
// generation of v (its whole manifest chain opens), and v is not deleted.
// Otherwise it fails with an error wrapping ErrFenced that says why, and
// nothing changed. Of concurrent publishers with the same expect exactly
// one wins. It returns the published head (Seq filled in).
func (r *Repo) Publish(ctx context.Context, v Volume, expect Head, next Head) (Head, error) {
	if err := v.Check(); err != nil {
		return Head{}, fmt.Errorf("publish %s: %w", v, err)
	}
	if len(next.Node) > MaxNodeLen {
		return Head{}, fmt.Errorf("publish %s: node name of %d bytes (at most %d)", v, len(next.Node), MaxNodeLen)
	}
	if deleted, err := r.deleted(ctx, v); err != nil {
		return Head{}, fmt.Errorf("publish %s: %w", v, err)
	} else if deleted {
		return Head{}, fmt.Errorf("publish %s: %w: %w", v, ErrFenced, ErrDeleted)
	}
	cur, err := r.Head(ctx, v)
	if err != nil {
		return Head{}, fmt.Errorf("publish %s: %w", v, err)
	}
	if cur.Seq != expect.Seq {
		return Head{}, fmt.Errorf("publish %s: %w: the head is %d, expected %d", v, ErrFenced, cur.Seq, expect.Seq)
	}
	if next.WriterEpoch < cur.WriterEpoch {
		return Head{}, fmt.Errorf("publish %s: %w: writer epoch %d is older than the head's %d", v, ErrFenced, next.WriterEpoch, cur.WriterEpoch)
	}
	// The whole chain, not only the manifest: a head must open. (GC
	// deletes children before parents and manifests before chunks, so an
	// existing chain never lacks a part GC took.)
	ref := GenRef{Volume: v, Generation: next.Generation}
	if _, err := r.Open(ctx, ref); err != nil {
		if errors.Is(err, ErrNotFound) {
			return Head{}, fmt.Errorf("publish %s: %w: generation %d is not committed: %w", v, ErrFenced, next.Generation, err)
		}
		return Head{}, fmt.Errorf("publish %s: %w", v, err)
	}
	next.Seq = cur.Seq + 1
	dk, err := r.keys.Get(ctx, v)
	if err != nil {
		return Head{}, fmt.Errorf("publish %s: %w", v, err)
	}
	key := headKey(v, next.Seq)
	blob, err := r.codec.seal(dk, kindHead, key, encodeHead(v, next))
	if err != nil {
		return Head{}, fmt.Errorf("publish %s: %w", v, err)
	}
	if err := r.store.Put(ctx, key, blob); err != nil {
		if errors.Is(err, ErrExists) {
			return Head{}, fmt.Errorf("publish %s: %w: another publisher took head %d", v, ErrFenced, next.Seq)
		}
		return Head{}, fmt.Errorf("publish %s: head %d: %w", v, next.Seq, err)
	}
	// A head number GC freed (superseded, older than its grace) can be
	// created again by a publisher that read the head before: its Put
	// then succeeds below the real head. It lost all the same.
	seqs, err := r.headSeqs(ctx, v)
	if err != nil {
		return Head{}, fmt.Errorf("publish %s: check head %d: %w", v, next.Seq, err)
	}
	if len(seqs) == 0 {
		return Head{}, fmt.Errorf("publish %s: %w: head %d was deleted with the volume", v, ErrFenced, next.Seq)
	}
	if top := seqs[len(seqs)-1]; top > next.Seq {
		return Head{}, fmt.Errorf("publish %s: %w: head %d was superseded by %d", v, ErrFenced, next.Seq, top)
	}
	return next, nil
}
