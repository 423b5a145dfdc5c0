package nbdsrv_test

// The server against a raw client written here: what a hostile or buggy
// client can send, concurrency, FLUSH/FUA ordering and shutdown.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/nbdsrv"
	"github.com/ctld/ctld/internal/nbdsrv/nbdtest"
	"github.com/ctld/ctld/internal/testutil"
)

const (
	cmdRead, cmdWrite, cmdDisc, cmdFlush, cmdTrim, cmdZeroes = 0, 1, 2, 3, 4, 6
	flagFUA                                                  = 1
	ePerm, eInval, eNoSpc, eOverflow                         = 1, 22, 28, 75
)

// rawClient speaks the wire protocol directly, so tests can send what no
// real client would.
type rawClient struct {
	t    *testing.T
	c    net.Conn
	size uint64
}

func dialRaw(t *testing.T, sock string) *rawClient {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawClient{t: t, c: c}
}

// hello reads the server greeting and sends client flags.
func (r *rawClient) hello(flags uint32) {
	r.t.Helper()
	var g [18]byte
	if _, err := io.ReadFull(r.c, g[:]); err != nil {
		r.t.Fatalf("read greeting: %v", err)
	}
	if binary.BigEndian.Uint64(g[:8]) != 0x4e42444d41474943 || binary.BigEndian.Uint16(g[16:]) != 3 {
		r.t.Fatalf("greeting %x", g)
	}
	r.write(binary.BigEndian.AppendUint32(nil, flags))
}

func (r *rawClient) option(opt uint32, data []byte) {
	b := binary.BigEndian.AppendUint64(nil, 0x49484156454F5054)
	b = binary.BigEndian.AppendUint32(b, opt)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	r.write(append(b, data...))
}

// optReply reads one option reply: type and data.
func (r *rawClient) optReply() (uint32, []byte) {
	r.t.Helper()
	var h [20]byte
	if _, err := io.ReadFull(r.c, h[:]); err != nil {
		r.t.Fatalf("read option reply: %v", err)
	}
	d := make([]byte, binary.BigEndian.Uint32(h[16:]))
	if _, err := io.ReadFull(r.c, d); err != nil {
		r.t.Fatalf("read option reply data: %v", err)
	}
	return binary.BigEndian.Uint32(h[12:16]), d
}

// connect does the whole handshake with NBD_OPT_GO for the default export.
func connect(t *testing.T, sock string) *rawClient {
	t.Helper()
	r := dialRaw(t, sock)
	r.hello(3)
	r.option(7, []byte{0, 0, 0, 0, 0, 0})
	for {
		typ, d := r.optReply()
		switch {
		case typ == 1:
			if r.size == 0 {
				t.Fatal("no NBD_INFO_EXPORT before ACK")
			}
			return r
		case typ == 3 && binary.BigEndian.Uint16(d) == 0:
			r.size = binary.BigEndian.Uint64(d[2:10])
		case typ == 3:
		default:
			t.Fatalf("NBD_OPT_GO reply type %#x", typ)
		}
	}
}

func (r *rawClient) write(b []byte) {
	r.t.Helper()
	if _, err := r.c.Write(b); err != nil {
		r.t.Fatalf("write to server: %v", err)
	}
}

func reqBytes(flags, typ uint16, handle, off uint64, length uint32) []byte {
	b := binary.BigEndian.AppendUint32(nil, 0x25609513)
	b = binary.BigEndian.AppendUint16(b, flags)
	b = binary.BigEndian.AppendUint16(b, typ)
	b = binary.BigEndian.AppendUint64(b, handle)
	b = binary.BigEndian.AppendUint64(b, off)
	return binary.BigEndian.AppendUint32(b, length)
}

func (r *rawClient) send(flags, typ uint16, handle, off uint64, length uint32, payload []byte) {
	r.t.Helper()
	r.write(append(reqBytes(flags, typ, handle, off, length), payload...))
}

// reply reads a simple reply header: error and handle.
func (r *rawClient) reply() (uint32, uint64, error) {
	var h [16]byte
	if _, err := io.ReadFull(r.c, h[:]); err != nil {
		return 0, 0, err
	}
	if binary.BigEndian.Uint32(h[:4]) != 0x67446698 {
		r.t.Fatalf("reply magic %x", h[:4])
	}
	return binary.BigEndian.Uint32(h[4:8]), binary.BigEndian.Uint64(h[8:]), nil
}

func (r *rawClient) mustReply(handle uint64, errno uint32) {
	r.t.Helper()
	e, h, err := r.reply()
	if err != nil {
		r.t.Fatalf("request %d: no reply: %v", handle, err)
	}
	if h != handle || e != errno {
		r.t.Fatalf("reply: handle %d error %d, want handle %d error %d", h, e, handle, errno)
	}
}

func (r *rawClient) read(handle, off uint64, n uint32) []byte {
	r.t.Helper()
	r.send(0, cmdRead, handle, off, n, nil)
	r.mustReply(handle, 0)
	b := make([]byte, n)
	if _, err := io.ReadFull(r.c, b); err != nil {
		r.t.Fatal(err)
	}
	return b
}

// mustClose checks the server closed the connection and returns how many
// bytes came before the end.
func (r *rawClient) mustClose() int64 {
	r.t.Helper()
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, r.c)
	if err != nil {
		r.t.Fatalf("server did not close the connection: %v (after %d bytes)", err, n)
	}
	return n
}

func fileExport(t *testing.T, size int64, readOnly bool) (nbdsrv.Export, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.img")
	sparseFile(t, p, size)
	f, err := nbdsrv.OpenFile(p, readOnly)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return nbdsrv.Export{Name: "test", Backend: f, ReadOnly: readOnly}, p
}

func totalAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.TotalAlloc
}

// Each bad request gets an NBD error and leaves the stream usable, without
// the server allocating for the length the client claims.
func TestBadRequestsGetErrors(t *testing.T) {
	const size = 1 << 20
	exp, _ := fileExport(t, size, false)
	s := nbdtest.Serve(t, exp, nbdsrv.Options{MaxRequest: 1 << 20})
	r := connect(t, s.Sock)
	if r.size != size {
		t.Fatalf("size %d", r.size)
	}
	before := totalAlloc()
	cases := []struct {
		name    string
		flags   uint16
		typ     uint16
		off     uint64
		length  uint32
		payload bool
		want    uint32
	}{
		{"read beyond end", 0, cmdRead, size, 512, false, eInval},
		{"read straddling end", 0, cmdRead, size - 512, 1024, false, eInval},
		{"read offset+length overflows", 0, cmdRead, ^uint64(0) - 511, 1024, false, eInval},
		{"read of 4 GiB", 0, cmdRead, 0, ^uint32(0), false, eOverflow},
		{"read above max request", 0, cmdRead, 0, 1<<20 + 1, false, eOverflow},
		{"read of zero length", 0, cmdRead, 0, 0, false, eInval},
		{"write beyond end", 0, cmdWrite, size, 4096, true, eNoSpc},
		{"write offset+length overflows", 0, cmdWrite, ^uint64(0) - 511, 1024, true, eNoSpc},
		{"write above max request", 0, cmdWrite, 0, 1<<20 + 4096, true, eOverflow},
		{"trim beyond end", 0, cmdTrim, size - 4096, 8192, false, eInval},
		{"write zeroes beyond end", 0, cmdZeroes, size, 1, false, eNoSpc},
		{"unknown command", 0, 42, 0, 512, false, eInval},
		{"block status (not offered)", 0, 7, 0, 512, false, eInval},
		{"unknown flag", 1 << 7, cmdRead, 0, 512, false, eInval},
		{"no-hole on a write", 2, cmdWrite, 0, 512, true, eInval},
		{"flush with a length", 0, cmdFlush, 0, 512, false, eInval},
	}
	for i, c := range cases {
		var p []byte
		if c.payload {
			p = make([]byte, c.length)
		}
		r.send(c.flags, c.typ, uint64(i), c.off, c.length, p)
		e, h, err := r.reply()
		if err != nil {
			t.Fatalf("%s: no reply: %v", c.name, err)
		}
		if h != uint64(i) || e != c.want {
			t.Errorf("%s: reply handle %d error %d, want handle %d error %d", c.name, h, e, i, c.want)
		}
	}
	if got := totalAlloc() - before; got > 16<<20 {
		t.Errorf("server allocated %d bytes for bad requests", got)
	}
	// The stream is still in sync: a good write and read round-trip.
	r.send(0, cmdWrite, 100, 4096, 4, []byte("abcd"))
	r.mustReply(100, 0)
	if got := r.read(101, 4096, 4); string(got) != "abcd" {
		t.Fatalf("read back %q", got)
	}
	r.send(0, cmdDisc, 102, 0, 0, nil)
	r.mustClose()
}

func TestReadOnlyExportRefusesWrites(t *testing.T) {
	exp, path := fileExport(t, 1<<20, true)
	s := nbdtest.Serve(t, exp, nbdsrv.Options{})
	r := connect(t, s.Sock)
	r.send(0, cmdWrite, 1, 0, 4, []byte("evil"))
	r.mustReply(1, ePerm)
	r.send(0, cmdTrim, 2, 0, 4096, nil)
	r.mustReply(2, ePerm)
	r.send(0, cmdZeroes, 3, 0, 4096, nil)
	r.mustReply(3, ePerm)
	r.send(0, cmdFlush, 4, 0, 0, nil)
	r.mustReply(4, 0)
	r.read(5, 0, 4)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, make([]byte, 1<<20)) {
		t.Fatal("read-only export was written")
	}
}

// Protocol violations close the connection; nothing is allocated for them.
func TestProtocolViolationsCloseTheConnection(t *testing.T) {
	exp, _ := fileExport(t, 1<<20, false)
	s := nbdtest.Serve(t, exp, nbdsrv.Options{})
	before := totalAlloc()

	t.Run("bad request magic", func(t *testing.T) {
		r := connect(t, s.Sock)
		b := reqBytes(0, cmdRead, 1, 0, 512)
		b[0] ^= 0xff
		r.write(b)
		r.mustClose()
	})
	t.Run("unknown client flags", func(t *testing.T) {
		r := dialRaw(t, s.Sock)
		r.hello(1 << 5)
		r.mustClose()
	})
	t.Run("bad option magic", func(t *testing.T) {
		r := dialRaw(t, s.Sock)
		r.hello(3)
		r.write(make([]byte, 16))
		r.mustClose()
	})
	t.Run("option of 1 GiB", func(t *testing.T) {
		r := dialRaw(t, s.Sock)
		r.hello(3)
		b := binary.BigEndian.AppendUint64(nil, 0x49484156454F5054)
		b = binary.BigEndian.AppendUint32(b, 7)
		r.write(binary.BigEndian.AppendUint32(b, 1<<30))
		r.mustClose()
	})
	t.Run("write claiming 4 GiB then hanging up", func(t *testing.T) {
		r := connect(t, s.Sock)
		r.send(0, cmdWrite, 1, 0, ^uint32(0), make([]byte, 1<<16))
		_ = r.c.Close()
	})
	t.Run("export name unknown", func(t *testing.T) {
		r := dialRaw(t, s.Sock)
		r.hello(3)
		r.option(1, []byte("other"))
		r.mustClose()
	})
	if got := totalAlloc() - before; got > 16<<20 {
		t.Errorf("server allocated %d bytes for hostile clients", got)
	}
	// The server still serves.
	r := connect(t, s.Sock)
	r.read(1, 0, 512)
}

func TestOptionPhase(t *testing.T) {
	exp, _ := fileExport(t, 1<<20, false)
	s := nbdtest.Serve(t, exp, nbdsrv.Options{})
	r := dialRaw(t, s.Sock)
	r.hello(3)
	r.option(8, []byte{0}) // structured replies take no data
	if typ, _ := r.optReply(); typ != 3|1<<31 {
		t.Errorf("NBD_OPT_STRUCTURED_REPLY with data: reply %#x, want NBD_REP_ERR_INVALID", typ)
	}
	r.option(10, []byte{0, 0, 0, 0, 0, 0, 0, 0}) // meta contexts need structured replies
	if typ, _ := r.optReply(); typ != 3|1<<31 {
		t.Errorf("NBD_OPT_SET_META_CONTEXT before structured replies: reply %#x, want NBD_REP_ERR_INVALID", typ)
	}
	r.option(5, nil) // TLS: not offered
	if typ, _ := r.optReply(); typ != 1|1<<31 {
		t.Errorf("NBD_OPT_STARTTLS: reply %#x, want NBD_REP_ERR_UNSUP", typ)
	}
	r.option(3, nil) // list
	if typ, d := r.optReply(); typ != 2 || string(d[4:]) != "test" {
		t.Errorf("NBD_OPT_LIST: reply %#x %q", typ, d)
	}
	if typ, _ := r.optReply(); typ != 1 {
		t.Errorf("NBD_OPT_LIST: no ACK (%#x)", typ)
	}
	r.option(6, []byte{0, 0, 0, 9, 'n', 'o'}) // info with a name longer than the data
	if typ, _ := r.optReply(); typ != 3|1<<31 {
		t.Errorf("malformed NBD_OPT_INFO: reply %#x, want NBD_REP_ERR_INVALID", typ)
	}
	r.option(6, []byte{0, 0, 0, 2, 'n', 'o', 0, 0}) // unknown export
	if typ, _ := r.optReply(); typ != 6|1<<31 {
		t.Errorf("NBD_OPT_INFO of an unknown export: reply %#x, want NBD_REP_ERR_UNKNOWN", typ)
	}
	// Old-style NBD_OPT_EXPORT_NAME with NO_ZEROES: size and flags only.
	r.option(1, []byte("test"))
	var b [10]byte
	if _, err := io.ReadFull(r.c, b[:]); err != nil {
		t.Fatal(err)
	}
	if binary.BigEndian.Uint64(b[:8]) != 1<<20 {
		t.Fatalf("NBD_OPT_EXPORT_NAME: size %d", binary.BigEndian.Uint64(b[:8]))
	}
	r.read(1, 0, 512)
}

// gateBackend holds reads until released and records the most it saw at once.
type gateBackend struct {
	nbdsrv.Backend
	release  chan struct{}
	entered  chan struct{}
	cur, max atomic.Int64
	syncs    atomic.Int64
	writes   atomic.Int64
	mu       sync.Mutex
	log      []string // order of completed writes and syncs
}

func (g *gateBackend) ReadAt(p []byte, off int64) (int, error) {
	n := g.cur.Add(1)
	for {
		m := g.max.Load()
		if n <= m || g.max.CompareAndSwap(m, n) {
			break
		}
	}
	g.entered <- struct{}{}
	<-g.release
	g.cur.Add(-1)
	return g.Backend.ReadAt(p, off)
}

func (g *gateBackend) WriteAt(p []byte, off int64) (int, error) {
	n, err := g.Backend.WriteAt(p, off)
	g.writes.Add(1)
	g.note("write")
	return n, err
}

func (g *gateBackend) Sync() error {
	g.syncs.Add(1)
	g.note("sync")
	return g.Backend.Sync()
}

func (g *gateBackend) note(s string) {
	g.mu.Lock()
	g.log = append(g.log, s)
	g.mu.Unlock()
}

func newGate(t *testing.T) (*gateBackend, nbdsrv.Export) {
	exp, _ := fileExport(t, 1<<20, false)
	g := &gateBackend{Backend: exp.Backend, release: make(chan struct{}), entered: make(chan struct{}, 1024)}
	exp.Backend = g
	return g, exp
}

func waitEntered(t *testing.T, g *gateBackend, n int) {
	t.Helper()
	for i := range n {
		select {
		case <-g.entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d reads reached the backend at once: requests are not served concurrently", i, n)
		}
	}
}

// Requests are served concurrently, up to MaxInFlight and no more.
func TestRequestsServedConcurrentlyWithinBound(t *testing.T) {
	g, exp := newGate(t)
	const bound = 4
	s := nbdtest.Serve(t, exp, nbdsrv.Options{MaxInFlight: bound})
	r := connect(t, s.Sock)
	for i := range 10 {
		r.send(0, cmdRead, uint64(i), uint64(i)*512, 512, nil)
	}
	waitEntered(t, g, bound)
	select {
	case <-g.entered:
		t.Fatalf("more than %d reads in the backend at once", bound)
	case <-time.After(300 * time.Millisecond):
	}
	close(g.release)
	seen := map[uint64]bool{}
	for range 10 {
		e, h, err := r.reply()
		if err != nil || e != 0 {
			t.Fatalf("reply: %v error %d", err, e)
		}
		if _, err := io.ReadFull(r.c, make([]byte, 512)); err != nil {
			t.Fatal(err)
		}
		seen[h] = true
	}
	if len(seen) != 10 || g.max.Load() != bound {
		t.Fatalf("%d distinct replies, max in flight %d (bound %d)", len(seen), g.max.Load(), bound)
	}
}

// A write with FUA is synced before it is acknowledged; FLUSH syncs after
// the writes acknowledged before it.
func TestFUAAndFlushSyncAcknowledgedWrites(t *testing.T) {
	g, exp := newGate(t)
	s := nbdtest.Serve(t, exp, nbdsrv.Options{})
	r := connect(t, s.Sock)
	r.send(0, cmdWrite, 1, 0, 4, []byte("aaaa"))
	r.mustReply(1, 0)
	if n := g.syncs.Load(); n != 0 {
		t.Fatalf("%d syncs for a write without FUA", n)
	}
	r.send(flagFUA, cmdWrite, 2, 0, 4, []byte("bbbb"))
	r.mustReply(2, 0)
	if n := g.syncs.Load(); n != 1 {
		t.Fatalf("write with FUA acknowledged after %d syncs, want 1", n)
	}
	r.send(flagFUA, cmdTrim, 3, 4096, 4096, nil)
	r.mustReply(3, 0)
	r.send(flagFUA, cmdZeroes, 4, 8192, 4096, nil)
	r.mustReply(4, 0)
	if n := g.syncs.Load(); n != 3 {
		t.Fatalf("trim and write zeroes with FUA: %d syncs in all, want 3", n)
	}
	r.send(0, cmdWrite, 5, 0, 4, []byte("cccc"))
	r.mustReply(5, 0)
	r.send(0, cmdFlush, 6, 0, 0, nil)
	r.mustReply(6, 0)
	g.mu.Lock()
	last := g.log[len(g.log)-2:]
	g.mu.Unlock()
	if last[0] != "write" || last[1] != "sync" {
		t.Fatalf("flush: backend calls end %v, want a sync after the acknowledged write", last)
	}
}

// Cancelling Serve's context answers the requests in flight, syncs, closes
// the connection and returns.
func TestShutdownFinishesInFlightRequests(t *testing.T) {
	g, exp := newGate(t)
	s := nbdtest.Serve(t, exp, nbdsrv.Options{})
	r := connect(t, s.Sock)
	r.send(0, cmdWrite, 1, 0, 4, []byte("dddd"))
	r.mustReply(1, 0)
	r.send(0, cmdRead, 2, 0, 4, nil)
	waitEntered(t, g, 1)
	stopped := make(chan struct{})
	go func() { s.Stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Serve returned with a request in flight")
	case <-time.After(200 * time.Millisecond):
	}
	close(g.release)
	r.mustReply(2, 0)
	b := make([]byte, 4)
	if _, err := io.ReadFull(r.c, b); err != nil || string(b) != "dddd" {
		t.Fatalf("in-flight read: %q %v", b, err)
	}
	r.mustClose()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	if g.syncs.Load() == 0 {
		t.Fatal("no sync at shutdown")
	}
	// And the listener is gone.
	if c, err := net.Dial("unix", s.Sock); err == nil {
		_ = c.Close()
		t.Fatal("socket still accepts after shutdown")
	}
}

// Serve with a context that is already done returns at once.
func TestServeCancelled(t *testing.T) {
	exp, _ := fileExport(t, 4096, false)
	srv, err := nbdsrv.New(exp, nbdsrv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(testutil.SocketDir(t), "s"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := srv.Serve(ctx, l); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// A client that stalls in the handshake is dropped after HandshakeTimeout;
// connections beyond MaxConns are closed at once.
func TestHandshakeTimeoutAndConnectionLimit(t *testing.T) {
	exp, _ := fileExport(t, 1<<20, false)
	s := nbdtest.Serve(t, exp, nbdsrv.Options{HandshakeTimeout: 300 * time.Millisecond, MaxConns: 2})
	r := dialRaw(t, s.Sock)
	r.hello(3)
	t0 := time.Now()
	r.mustClose()
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("stalled handshake closed after %s", d)
	}

	s2 := nbdtest.Serve(t, exp, nbdsrv.Options{MaxConns: 2})
	a, b := connect(t, s2.Sock), connect(t, s2.Sock)
	c := dialRaw(t, s2.Sock)
	if n := c.mustClose(); n != 0 {
		t.Fatalf("connection over MaxConns got %d bytes (a greeting) before it was closed", n)
	}
	a.read(1, 0, 512)
	b.read(1, 0, 512)
}
