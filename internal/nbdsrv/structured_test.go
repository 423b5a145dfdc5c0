package nbdsrv_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/nbdsrv"
	"github.com/ctld/ctld/internal/nbdsrv/nbdtest"
)

const cmdBlockStatus, flagReqOne = 7, 1 << 3

// extentBackend is a file backend that lists extents: 4 KiB blocks, odd
// ones holes reading as zeros; a read at failAt fails.
type extentBackend struct {
	nbdsrv.Backend
	failAt int64
}

func (e *extentBackend) Extents(off, length int64) ([]nbdsrv.Extent, error) {
	var out []nbdsrv.Extent
	for at := off; at < off+length; {
		l := min((at/4096+1)*4096, off+length) - at
		z := (at/4096)%2 == 1
		out = append(out, nbdsrv.Extent{Length: l, Hole: z, Zero: z})
		at += l
	}
	return out, nil
}

func (e *extentBackend) ReadAt(p []byte, off int64) (int, error) {
	if off == e.failAt {
		return 0, errors.New("backend read failed")
	}
	return e.Backend.ReadAt(p, off)
}

// chunk reads one structured reply chunk: flags, type, handle, payload.
func (r *rawClient) chunk() (uint16, uint16, uint64, []byte) {
	r.t.Helper()
	var h [20]byte
	if _, err := io.ReadFull(r.c, h[:]); err != nil {
		r.t.Fatalf("read reply chunk: %v", err)
	}
	if binary.BigEndian.Uint32(h[:4]) != 0x668e33ef {
		r.t.Fatalf("chunk magic %x, want the structured reply magic", h[:4])
	}
	d := make([]byte, binary.BigEndian.Uint32(h[16:20]))
	if _, err := io.ReadFull(r.c, d); err != nil {
		r.t.Fatalf("read chunk payload: %v", err)
	}
	return binary.BigEndian.Uint16(h[4:6]), binary.BigEndian.Uint16(h[6:8]), binary.BigEndian.Uint64(h[8:16]), d
}

func metaQuery(name string, queries ...string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(queries)))
	for _, q := range queries {
		b = binary.BigEndian.AppendUint32(b, uint32(len(q)))
		b = append(b, q...)
	}
	return b
}

// With structured replies negotiated, READ is answered with one data chunk
// (or an error chunk, never a simple reply), other commands with simple
// replies; base:allocation is offered for a backend that lists extents and
// BLOCK_STATUS reports them, one with REQ_ONE, and is EINVAL unless the
// context was selected.
func TestStructuredRepliesAndBlockStatus(t *testing.T) {
	exp, _ := fileExport(t, 64<<10, false)
	be := &extentBackend{Backend: exp.Backend, failAt: 8192}
	exp.Backend = be
	s := nbdtest.Serve(t, exp, nbdsrv.Options{})

	r := dialRaw(t, s.Sock)
	r.hello(3)
	r.option(8, nil)
	if typ, _ := r.optReply(); typ != 1 {
		t.Fatalf("NBD_OPT_STRUCTURED_REPLY: reply %#x, want ACK", typ)
	}
	r.option(9, metaQuery("test")) // LIST, no query: every context
	if typ, d := r.optReply(); typ != 4 || string(d[4:]) != "base:allocation" || binary.BigEndian.Uint32(d) != 0 {
		t.Fatalf("NBD_OPT_LIST_META_CONTEXT: reply %#x %q", typ, d)
	}
	if typ, _ := r.optReply(); typ != 1 {
		t.Fatalf("NBD_OPT_LIST_META_CONTEXT: no ACK (%#x)", typ)
	}
	r.option(10, metaQuery("other", "base:allocation"))
	if typ, _ := r.optReply(); typ != 6|1<<31 {
		t.Fatalf("NBD_OPT_SET_META_CONTEXT of an unknown export: reply %#x, want NBD_REP_ERR_UNKNOWN", typ)
	}
	r.option(10, metaQuery("test", "base:allocation")[:9]) // truncated
	if typ, _ := r.optReply(); typ != 3|1<<31 {
		t.Fatalf("truncated NBD_OPT_SET_META_CONTEXT: reply %#x, want NBD_REP_ERR_INVALID", typ)
	}
	r.option(10, metaQuery("test", "x-other:thing", "base:allocation"))
	typ, d := r.optReply()
	if typ != 4 || string(d[4:]) != "base:allocation" {
		t.Fatalf("NBD_OPT_SET_META_CONTEXT: reply %#x %q", typ, d)
	}
	ctxID := binary.BigEndian.Uint32(d)
	if typ, _ := r.optReply(); typ != 1 {
		t.Fatalf("NBD_OPT_SET_META_CONTEXT: no ACK (%#x)", typ)
	}
	r.option(7, []byte{0, 0, 0, 0, 0, 0})
	for {
		typ, d := r.optReply()
		if typ == 1 {
			break
		}
		if typ != 3 {
			t.Fatalf("NBD_OPT_GO reply %#x", typ)
		}
		if binary.BigEndian.Uint16(d) == 0 {
			r.size = binary.BigEndian.Uint64(d[2:10])
		}
	}

	want := bytes.Repeat([]byte("structured"), 1000)[:5000]
	r.send(0, cmdWrite, 1, 100, uint32(len(want)), want)
	r.mustReply(1, 0) // a simple reply: no data
	r.send(0, cmdRead, 2, 100, uint32(len(want)), nil)
	flags, typ16, h, p := r.chunk()
	if flags != 1 || typ16 != 1 || h != 2 || binary.BigEndian.Uint64(p) != 100 || !bytes.Equal(p[8:], want) {
		t.Fatalf("READ: chunk flags %d type %d handle %d, %d bytes; want one DONE data chunk at 100 with the data", flags, typ16, h, len(p))
	}
	r.send(0, cmdRead, 3, 8192, 512, nil) // the backend fails here
	if flags, typ16, h, p := r.chunk(); flags != 1 || typ16 != 1<<15|1 || h != 3 || binary.BigEndian.Uint32(p) != uint32(unix.EIO) {
		t.Fatalf("failed READ: chunk flags %d type %#x handle %d payload %x; want a DONE error chunk with EIO", flags, typ16, h, p)
	}
	r.send(0, cmdRead, 4, r.size, 512, nil) // beyond the end: refused before the backend
	if flags, typ16, h, p := r.chunk(); flags != 1 || typ16 != 1<<15|1 || h != 4 || binary.BigEndian.Uint32(p) != eInval {
		t.Fatalf("READ beyond the end: chunk flags %d type %#x handle %d payload %x; want an EINVAL error chunk", flags, typ16, h, p)
	}

	// Blocks 0..3 from 1024 on: data 3 KiB, hole 4 KiB, data 4 KiB, hole
	// 1 KiB of the 12 KiB asked.
	r.send(0, cmdBlockStatus, 5, 1024, 12<<10, nil)
	flags, typ16, h, p = r.chunk()
	if flags != 1 || typ16 != 5 || h != 5 || binary.BigEndian.Uint32(p) != ctxID {
		t.Fatalf("BLOCK_STATUS: chunk flags %d type %d handle %d ctx %d", flags, typ16, h, binary.BigEndian.Uint32(p))
	}
	wantDesc := []uint32{3 << 10, 0, 4 << 10, 3, 4 << 10, 0, 1 << 10, 3}
	var got []uint32
	for i := 4; i+4 <= len(p); i += 4 {
		got = append(got, binary.BigEndian.Uint32(p[i:]))
	}
	if len(p) != 4+4*len(wantDesc) || !equalU32(got, wantDesc) {
		t.Fatalf("BLOCK_STATUS descriptors %v, want %v", got, wantDesc)
	}
	r.send(flagReqOne, cmdBlockStatus, 6, 4096, 12<<10, nil)
	if _, _, _, p := r.chunk(); len(p) != 12 || binary.BigEndian.Uint32(p[4:]) != 4096 || binary.BigEndian.Uint32(p[8:]) != 3 {
		t.Fatalf("BLOCK_STATUS with REQ_ONE: payload %x, want one hole of 4096", p)
	}
	r.send(0, cmdBlockStatus, 7, r.size-512, 1024, nil)
	if flags, typ16, h, p := r.chunk(); flags != 1 || typ16 != 1<<15|1 || h != 7 || binary.BigEndian.Uint32(p) != eInval {
		t.Fatalf("BLOCK_STATUS beyond the end: chunk type %#x payload %x, want an EINVAL error chunk", typ16, p)
	}

	// Structured replies without a selected context: no BLOCK_STATUS.
	r2 := dialRaw(t, s.Sock)
	r2.hello(3)
	r2.option(8, nil)
	if typ, _ := r2.optReply(); typ != 1 {
		t.Fatalf("NBD_OPT_STRUCTURED_REPLY: %#x", typ)
	}
	r2.option(10, metaQuery("test", "x-other:thing")) // selects nothing
	if typ, _ := r2.optReply(); typ != 1 {
		t.Fatalf("NBD_OPT_SET_META_CONTEXT of nothing known: reply %#x, want a bare ACK", typ)
	}
	r2.option(7, []byte{0, 0, 0, 0, 0, 0})
	for typ, _ := r2.optReply(); typ != 1; typ, _ = r2.optReply() {
	}
	r2.send(0, cmdBlockStatus, 1, 0, 4096, nil)
	if _, typ16, _, p := r2.chunk(); typ16 != 1<<15|1 || binary.BigEndian.Uint32(p) != eInval {
		t.Fatalf("BLOCK_STATUS without a context: chunk type %#x payload %x, want EINVAL", typ16, p)
	}

	// A backend without extents offers no context.
	plain, _ := fileExport(t, 64<<10, false)
	r3 := dialRaw(t, nbdtest.Serve(t, plain, nbdsrv.Options{}).Sock)
	r3.hello(3)
	r3.option(8, nil)
	r3.optReply()
	r3.option(9, metaQuery("test"))
	if typ, _ := r3.optReply(); typ != 1 {
		t.Fatalf("NBD_OPT_LIST_META_CONTEXT of a backend without extents: reply %#x, want a bare ACK", typ)
	}
}

func equalU32(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
