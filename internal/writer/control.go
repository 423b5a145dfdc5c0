package writer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/cowdev"
	"github.com/ctld/ctld/internal/logging"
)

// CtlName is the running writer's control socket in Spec.Dir (mode 0600,
// removed when the writer exits): one JSON request, one JSON answer per
// connection (see Supervisor.Seal).
const CtlName = "ctl.sock"

// maxCtlPath is the longest socket path a sockaddr_un holds (108 bytes
// with the NUL).
const maxCtlPath = 107

// ctlAddr is the address to bind or dial for dir's control socket: its
// path, or, when that is too long for a sockaddr_un, the same file named
// through an O_PATH descriptor of dir (/proc/self/fd/N/ctl.sock), which
// done closes (once the listener or the dial is done with the name).
func ctlAddr(dir string) (addr string, done func(), err error) {
	path := filepath.Join(dir, CtlName)
	if len(path) <= maxCtlPath {
		return path, func() {}, nil
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("control socket dir: %w", err)
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", fd, CtlName), func() { _ = unix.Close(fd) }, nil
}

// Bounds of one control exchange.
const (
	maxCtlRequest = 4 << 10  // a request's bytes
	maxCtlAnswer  = 64 << 10 // an answer's bytes
	ctlReadTime   = 5 * time.Second
)

// SealRequest asks the running writer to seal its device as generation
// Generation of the device's volume (Spec.SealVolume: the sandbox's),
// over the device's base. Epoch must be the writer's: a writer of an
// older attach refuses (ErrStaleEpoch).
type SealRequest struct {
	Generation uint64 `json:"generation"`
	Epoch      uint64 `json:"epoch"`
}

// SealResult is what a seal committed and what it cost.
type SealResult struct {
	// Ref is the committed generation, Parent the base it was sealed over
	// (the device's base before; Ref is its base now).
	Ref    blockstore.GenRef `json:"ref"`
	Parent blockstore.GenRef `json:"parent"`
	// Chunks are the chunks written to the generation: DataChunks with
	// data, ZeroChunks holes; Bytes the data chunks' size before
	// compression.
	Chunks     int   `json:"chunks"`
	DataChunks int   `json:"data_chunks"`
	ZeroChunks int   `json:"zero_chunks"`
	Bytes      int64 `json:"bytes"`
	// Barrier is how long the device's writes were held; Took the whole
	// seal in the writer.
	Barrier time.Duration `json:"barrier"`
	Took    time.Duration `json:"took"`
}

// ctlRequest is the wire form of a request: Op names it.
type ctlRequest struct {
	Op         string `json:"op"`
	Generation uint64 `json:"generation"`
	Epoch      uint64 `json:"epoch"`
}

// Answer codes of a refusal or failure (ctlAnswer.Code).
const (
	codeStale   = "stale_epoch" // ErrStaleEpoch
	codeInvalid = "invalid"     // the request is malformed or names a bad generation
	codeExists  = "exists"      // blockstore.ErrExists: the generation is committed already
	codeFailed  = "failed"      // anything else (the store's error)
)

// ctlAnswer is the wire form of an answer: Seal on success, else Error
// and Code.
type ctlAnswer struct {
	Seal  *SealResult `json:"seal,omitempty"`
	Stats *Stats      `json:"stats,omitempty"`
	Error string      `json:"error,omitempty"`
	Code  string      `json:"code,omitempty"`
}

// decodeStrict decodes exactly one JSON value of b into v: unknown
// fields and trailing data are refused.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

// readLimited reads r to EOF, refusing more than limit bytes.
func readLimited(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("more than %d bytes", limit)
	}
	return b, nil
}

// readLine reads one newline-terminated line of at most limit bytes.
func readLine(r io.Reader, limit int) ([]byte, error) {
	b, err := bufio.NewReader(io.LimitReader(r, int64(limit)+1)).ReadBytes('\n')
	if err != nil {
		if len(b) > limit {
			return nil, fmt.Errorf("more than %d bytes", limit)
		}
		return nil, err
	}
	return b, nil
}

// control is the writer's control socket server.
type control struct {
	spec     Spec
	dev      *cowdev.Device
	stats    func() Stats // the "stats" op's answer (stats.go)
	log      *slog.Logger
	ln       *net.UnixListener
	path     string
	ctx      context.Context // ends when the writer stops: in-flight seals are cancelled
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	specMu   sync.Mutex // one spec.json rewrite at a time
	stopOnce sync.Once
}

// listenControl serves the control socket in spec.Dir until stop. A stale
// socket (a writer killed before it removed it) is replaced: this writer
// holds the Dir's lock.
func listenControl(spec Spec, dev *cowdev.Device, stats func() Stats, log *slog.Logger) (*control, error) {
	path := filepath.Join(spec.Dir, CtlName)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	// Only the owner may connect: bound under a umask that leaves the
	// socket 0600 from the start (Dir is 0700 as well).
	addr, done, err := ctlAddr(spec.Dir)
	if err != nil {
		return nil, err
	}
	defer done() // bound: the name is not needed again
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	// Removed by stop, by its path (the bound name may be a
	// descriptor's, closed by then).
	ln.SetUnlinkOnClose(false)
	ctx, cancel := context.WithCancel(context.Background())
	c := &control{spec: spec, dev: dev, stats: stats, log: logging.OrDiscard(log), ln: ln, path: path, ctx: ctx, cancel: cancel}
	c.wg.Add(1)
	go c.accept()
	return c, nil
}

// stop closes the socket (removing it), cancels the seals in flight and
// waits for every exchange to end.
func (c *control) stop() {
	c.stopOnce.Do(func() {
		c.cancel()
		_ = c.ln.Close()
		_ = os.Remove(c.path)
		c.wg.Wait()
	})
}

func (c *control) accept() {
	defer c.wg.Done()
	for {
		conn, err := c.ln.AcceptUnix()
		if err != nil {
			if c.ctx.Err() == nil {
				c.log.Error("control socket accept", "err", err)
			}
			return
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer conn.Close()
			c.serve(conn)
		}()
	}
}

// serve answers one request: one line of JSON. A client that closes the
// connection before the answer cancels a seal still running (its caller
// gave up, so a generation it would never hear of is not committed, if
// it is not too late).
func (c *control) serve(conn *net.UnixConn) {
	_ = conn.SetReadDeadline(time.Now().Add(ctlReadTime))
	b, err := readLine(conn, maxCtlRequest)
	if err != nil {
		c.answer(conn, ctlAnswer{Error: "read request: " + err.Error(), Code: codeInvalid})
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	var req ctlRequest
	if err := decodeStrict(b, &req); err != nil {
		c.answer(conn, ctlAnswer{Error: "request: " + err.Error(), Code: codeInvalid})
		return
	}
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	go func() {
		// The client sends nothing more: a read ends when it closes the
		// connection (or ours closes after the answer).
		var p [1]byte
		_, _ = conn.Read(p[:])
		cancel()
	}()
	switch req.Op {
	case "seal":
		c.answer(conn, c.seal(ctx, SealRequest{Generation: req.Generation, Epoch: req.Epoch}))
	case "stats":
		c.answer(conn, c.statsAnswer())
	default:
		c.answer(conn, ctlAnswer{Error: fmt.Sprintf("unknown op %q", req.Op), Code: codeInvalid})
	}
}

func (c *control) answer(conn *net.UnixConn, a ctlAnswer) {
	b, err := json.Marshal(a)
	if err == nil {
		_ = conn.SetWriteDeadline(time.Now().Add(ctlReadTime))
		_, err = conn.Write(b)
	}
	if err != nil {
		c.log.Warn("control answer", "err", err)
	}
}

// seal runs one seal of the device and, on success, records the new base
// in Dir/spec.json (if that is still this writer's spec), so a restart
// from it opens over the new generation. A crash between the commit and
// that record is covered by cowdev's re-open rules (cowdev.openIndex).
func (c *control) seal(ctx context.Context, req SealRequest) ctlAnswer {
	if req.Epoch != c.spec.Epoch {
		return ctlAnswer{Error: fmt.Sprintf("%v: the writer is of epoch %d, the request of %d", ErrStaleEpoch, c.spec.Epoch, req.Epoch), Code: codeStale}
	}
	ref := blockstore.GenRef{Volume: c.spec.SealVolume(), Generation: req.Generation}
	if err := ref.Volume.Check(); err != nil {
		return ctlAnswer{Error: err.Error(), Code: codeInvalid}
	}
	if base := c.dev.Base(); base.Volume == ref.Volume && ref.Generation <= base.Generation {
		return ctlAnswer{Error: fmt.Sprintf("generation %s is not newer than the device's base %s", ref, base), Code: codeInvalid}
	}
	st, err := c.dev.Seal(ctx, ref)
	if err != nil {
		c.log.Error("seal failed; the device serves on unchanged", "generation", ref.String(), "err", err)
		code := codeFailed
		if errors.Is(err, blockstore.ErrExists) {
			code = codeExists
		}
		return ctlAnswer{Error: err.Error(), Code: code}
	}
	if err := c.recordBase(ref); err != nil {
		// The generation is committed and the device rebased; a
		// restart from the old spec still opens correctly (one step).
		c.log.Warn("record the sealed generation in the spec", "generation", ref.String(), "err", err)
	}
	return ctlAnswer{Seal: &SealResult{
		Ref: st.Ref, Parent: st.Parent,
		Chunks: st.DataChunks + st.ZeroChunks, DataChunks: st.DataChunks, ZeroChunks: st.ZeroChunks, Bytes: st.Bytes,
		Barrier: st.Barrier, Took: st.Took,
	}}
}

// recordBase rewrites Dir/spec.json with Base = ref, if it is this
// writer's spec (same epoch: a newer attach's spec is never touched).
func (c *control) recordBase(ref blockstore.GenRef) error {
	c.specMu.Lock()
	defer c.specMu.Unlock()
	path := filepath.Join(c.spec.Dir, SpecName)
	spec, err := readSpec(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil // run without a supervisor's spec file
	}
	if err != nil {
		return err
	}
	if spec.Epoch != c.spec.Epoch {
		return nil
	}
	spec.Base = ref
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return writeFileAtomic(path, b)
}

// ErrInvalidSeal: the writer refused a malformed seal request or one
// naming a generation that is not newer than its base.
var ErrInvalidSeal = errors.New("invalid seal request")

// Seal asks the Dir's running writer to seal its device as generation
// req.Generation of the sandbox's volume, over its base (see cowdev's
// Device.Seal: writes are held only for a copy of the chunk states, the
// dirty chunks are uploaded, the manifest is written last, then the
// device serves on over the new generation and Dir/spec.json names it as
// the Base). ctx bounds the wait; when it ends the writer is told to
// cancel the seal.
//
// Errors: ErrNotRunning (no live writer of the Dir's last attach),
// ErrStaleEpoch (req.Epoch is not the writer's), ErrInvalidSeal,
// blockstore.ErrExists (the generation is committed already), else the
// writer's error (the store's). After an error the device serves on
// unchanged; but an error that is not the writer's answer (ctx ended, the
// writer died) may hide a seal that committed: do not reuse the
// generation number.
func (s *Supervisor) Seal(ctx context.Context, dir string, req SealRequest) (SealResult, error) {
	fail := func(err error) (SealResult, error) {
		return SealResult{}, fmt.Errorf("seal %s as generation %d: %w", dir, req.Generation, err)
	}
	st, err := s.Check(ctx, dir)
	if err != nil {
		return fail(err)
	}
	if st.Epoch != req.Epoch {
		return fail(fmt.Errorf("%w: the writer is of epoch %d, the request of %d", ErrStaleEpoch, st.Epoch, req.Epoch))
	}
	conn, err := dialControl(ctx, dir)
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	// The end of ctx closes the connection: the writer cancels the seal.
	defer context.AfterFunc(ctx, func() { _ = conn.Close() })()
	b, err := json.Marshal(ctlRequest{Op: "seal", Generation: req.Generation, Epoch: req.Epoch})
	if err != nil {
		return fail(err)
	}
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return fail(fmt.Errorf("send request: %w", errors.Join(ctx.Err(), err)))
	}
	ans, err := readLimited(conn, maxCtlAnswer)
	if err == nil && len(ans) == 0 {
		err = errors.New("the writer closed the connection without an answer")
		if _, cerr := s.Check(context.WithoutCancel(ctx), dir); errors.Is(cerr, ErrNotRunning) {
			err = fmt.Errorf("%w: %v", ErrNotRunning, err)
		}
	}
	if err != nil {
		return fail(fmt.Errorf("read answer (the seal may have committed): %w", errors.Join(ctx.Err(), err)))
	}
	var a ctlAnswer
	if err := decodeStrict(ans, &a); err != nil {
		return fail(fmt.Errorf("answer: %w", err))
	}
	switch {
	case a.Code == "" && a.Seal != nil:
		s.log().Info("sealed", "dir", dir, "generation", a.Seal.Ref.String(), "parent", a.Seal.Parent.String(),
			"chunks", a.Seal.Chunks, "barrier", a.Seal.Barrier, "took", a.Seal.Took)
		return *a.Seal, nil
	case a.Code == codeStale:
		return fail(fmt.Errorf("%w: %s", ErrStaleEpoch, a.Error))
	case a.Code == codeInvalid:
		return fail(fmt.Errorf("%w: %s", ErrInvalidSeal, a.Error))
	case a.Code == codeExists:
		return fail(fmt.Errorf("%w: %s", blockstore.ErrExists, a.Error))
	case a.Code == codeFailed:
		return fail(fmt.Errorf("writer: %s", a.Error))
	}
	return fail(fmt.Errorf("answer: code %q, error %q", a.Code, a.Error))
}
