package nbdsrv

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/ctld/ctld/internal/logging"
	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// Limits a client cannot raise.
const (
	maxOptionLen  = 64 << 10 // option data; names are at most 4 KiB
	maxNameLen    = 4096
	minBlockSize  = 1
	prefBlockSize = 4096
)

// Export is what a Server serves: one named device.
type Export struct {
	// Name is the export name; the empty name (the clients' default)
	// selects this export too.
	Name        string
	Description string
	Backend     Backend
	// ReadOnly advertises NBD_FLAG_READ_ONLY and refuses writes with EPERM.
	ReadOnly bool
}

// Options bound what one client can make the server hold. Zero values take
// the defaults.
type Options struct {
	// MaxRequest is the largest READ/WRITE payload (default 32 MiB, the
	// size every client supports).
	MaxRequest uint32
	// MaxInFlight is the number of requests served at once per connection
	// (default 32); further requests wait unread in the socket.
	MaxInFlight int
	// MaxInFlightBytes bounds payload buffers per connection (default
	// 64 MiB, raised to MaxRequest if smaller).
	MaxInFlightBytes int64
	// MaxConns is the number of connections served at once (default 16);
	// more are closed at accept.
	MaxConns int
	// HandshakeTimeout bounds the option phase (default 10 s).
	HandshakeTimeout time.Duration
	// ShutdownGrace is how long in-flight replies may take to be written
	// after ctx ends (default 10 s).
	ShutdownGrace time.Duration
	Logger        *slog.Logger
}

// Server serves one export.
type Server struct {
	exp  Export
	opts Options
	log  *slog.Logger
	pool bufPool
	errs errCounters
}

// New checks the export and fills in the defaults.
func New(exp Export, opts Options) (*Server, error) {
	if exp.Backend == nil {
		return nil, errors.New("new nbd server: no backend")
	}
	if len(exp.Name) > maxNameLen || len(exp.Description) > maxNameLen {
		return nil, fmt.Errorf("new nbd server: name or description longer than %d", maxNameLen)
	}
	if opts.MaxRequest == 0 {
		opts.MaxRequest = 32 << 20
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 32
	}
	if opts.MaxInFlightBytes <= 0 {
		opts.MaxInFlightBytes = 64 << 20
	}
	opts.MaxInFlightBytes = max(opts.MaxInFlightBytes, int64(opts.MaxRequest))
	if opts.MaxConns <= 0 {
		opts.MaxConns = 16
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 10 * time.Second
	}
	if opts.ShutdownGrace <= 0 {
		opts.ShutdownGrace = 10 * time.Second
	}
	s := &Server{exp: exp, opts: opts, log: logging.OrDiscard(opts.Logger).With("export", exp.Name)}
	s.pool.init(int(opts.MaxRequest))
	return s, nil
}

// Serve accepts connections until ctx ends, then closes l, lets every
// connection finish its in-flight requests and returns nil.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	stop := context.AfterFunc(ctx, func() { _ = l.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, s.opts.MaxConns)
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept nbd connection: %w", err)
		}
		select {
		case slots <- struct{}{}:
		default:
			s.log.Warn("nbd connection refused: too many connections", "max", s.opts.MaxConns)
			_ = c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			if err := s.ServeConn(ctx, c); err != nil {
				s.log.Warn("nbd connection ended", "err", err)
			}
		}()
	}
}

// ServeConn runs the handshake and transmission on one connection (a
// listener's or a socketpair end) and closes it. It returns nil when the
// client disconnects or ctx ends.
func (s *Server) ServeConn(ctx context.Context, nc net.Conn) (err error) {
	defer nc.Close()
	defer func() {
		if err != nil {
			s.errs.conn.Add(1)
		}
	}()
	size, err := s.exp.Backend.Size()
	if err != nil {
		return fmt.Errorf("nbd export size: %w", err)
	}
	if size < 0 {
		return fmt.Errorf("nbd export size %d", size)
	}
	c := &conn{s: s, nc: nc, br: bufio.NewReaderSize(nc, 64<<10), size: uint64(size)}
	if sc, ok := nc.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			c.raw = rc
		}
	}
	// ctx ends: no new request is read; replies get ShutdownGrace.
	stop := context.AfterFunc(ctx, func() {
		_ = nc.SetReadDeadline(time.Now())
		_ = nc.SetWriteDeadline(time.Now().Add(s.opts.ShutdownGrace))
	})
	defer stop()
	if err := nc.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout)); err != nil {
		return fmt.Errorf("set nbd handshake deadline: %w", err)
	}
	ok, err := c.handshake()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("nbd handshake: %w", err)
	}
	if !ok {
		return nil // client aborted
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return fmt.Errorf("clear nbd handshake deadline: %w", err)
	}
	if ctx.Err() != nil { // AfterFunc may have run before the deadline was cleared
		return nil
	}
	return c.transmit(ctx)
}

func (s *Server) transmissionFlags() uint16 {
	f := tfHasFlags | tfSendFlush | tfCanMultiConn
	if s.exp.ReadOnly {
		return f | tfReadOnly
	}
	return f | tfSendFUA | tfSendTrim | tfSendZeroes
}

// conn is one client connection.
type conn struct {
	s    *Server
	nc   net.Conn
	br   *bufio.Reader
	size uint64

	// Negotiated in the option phase: structured replies (then READ and
	// BLOCK_STATUS are answered with chunks) and the base:allocation
	// metadata context (BLOCK_STATUS allowed).
	structured bool
	metaAlloc  bool

	wmu  sync.Mutex // one reply at a time on the wire
	werr error      // first write error; later replies are dropped
	// raw is the socket's descriptor, for replies sent with sendfile
	// (FileReader); nil when the connection has none (a net.Pipe).
	raw syscall.RawConn
}

var errProtocol = errors.New("nbd protocol violation")

// handshake runs the fixed newstyle option phase; ok is false when the
// client aborted.
func (c *conn) handshake() (ok bool, err error) {
	var hello [18]byte
	binary.BigEndian.PutUint64(hello[0:8], protocol.NEGOTIATION_MAGIC_OLDSTYLE)
	binary.BigEndian.PutUint64(hello[8:16], protocol.NEGOTIATION_MAGIC_OPTION)
	binary.BigEndian.PutUint16(hello[16:18], flagFixedNewstyle|flagNoZeroes)
	if _, err := c.nc.Write(hello[:]); err != nil {
		return false, err
	}
	var cf [4]byte
	if _, err := io.ReadFull(c.br, cf[:]); err != nil {
		return false, err
	}
	clientFlags := binary.BigEndian.Uint32(cf[:])
	if clientFlags&^(clientFixed|clientNoZeroes) != 0 {
		return false, fmt.Errorf("%w: unknown client flags %#x", errProtocol, clientFlags)
	}
	noZeroes := clientFlags&clientNoZeroes != 0
	for {
		var h [16]byte
		if _, err := io.ReadFull(c.br, h[:]); err != nil {
			return false, err
		}
		if binary.BigEndian.Uint64(h[0:8]) != protocol.NEGOTIATION_MAGIC_OPTION {
			return false, fmt.Errorf("%w: bad option magic", errProtocol)
		}
		opt := binary.BigEndian.Uint32(h[8:12])
		n := binary.BigEndian.Uint32(h[12:16])
		if n > maxOptionLen {
			return false, fmt.Errorf("%w: option %d of %d bytes", errProtocol, opt, n)
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(c.br, data); err != nil {
			return false, err
		}
		switch opt {
		case optExportName:
			if !c.nameMatches(string(data)) {
				return false, fmt.Errorf("unknown export %q", data)
			}
			b := make([]byte, 10, 10+124)
			binary.BigEndian.PutUint64(b[0:8], c.size)
			binary.BigEndian.PutUint16(b[8:10], c.s.transmissionFlags())
			if !noZeroes {
				b = b[:10+124]
			}
			_, err := c.nc.Write(b)
			return err == nil, err
		case optAbort:
			return false, c.optReply(opt, repAck, nil)
		case optList:
			if n != 0 {
				if err := c.optReply(opt, repErrInval, nil); err != nil {
					return false, err
				}
				continue
			}
			b := binary.BigEndian.AppendUint32(nil, uint32(len(c.s.exp.Name)))
			if err := c.optReply(opt, repServer, append(b, c.s.exp.Name...)); err != nil {
				return false, err
			}
			if err := c.optReply(opt, repAck, nil); err != nil {
				return false, err
			}
		case optInfo, optGo:
			done, err := c.infoOrGo(opt, data)
			if err != nil || done {
				return done, err
			}
		case optStructuredReply:
			if n != 0 {
				if err := c.optReply(opt, repErrInval, nil); err != nil {
					return false, err
				}
				continue
			}
			c.structured = true
			if err := c.optReply(opt, repAck, nil); err != nil {
				return false, err
			}
		case optListMetaContext, optSetMetaContext:
			if err := c.metaContext(opt, data); err != nil {
				return false, err
			}
		default: // TLS, extended headers, ...: not offered
			if err := c.optReply(opt, repErrUnsup, nil); err != nil {
				return false, err
			}
		}
	}
}

// metaContext answers NBD_OPT_LIST_META_CONTEXT / SET_META_CONTEXT. The
// only context is base:allocation, offered when the backend lists extents;
// SET replaces the selection (none selected: no BLOCK_STATUS).
func (c *conn) metaContext(opt uint32, data []byte) error {
	if !c.structured {
		return c.optReply(opt, repErrInval, nil) // needs structured replies first
	}
	// u32 name length, name, u32 query count, then each query as u32
	// length + string.
	bad := func() error { return c.optReply(opt, repErrInval, nil) }
	if len(data) < 8 {
		return bad()
	}
	nameLen := binary.BigEndian.Uint32(data[0:4])
	if uint64(nameLen) > uint64(len(data)-8) {
		return bad()
	}
	name := string(data[4 : 4+nameLen])
	rest := data[4+nameLen:]
	nq := binary.BigEndian.Uint32(rest[0:4])
	rest = rest[4:]
	var queries []string
	for range nq {
		if len(rest) < 4 {
			return bad()
		}
		ql := binary.BigEndian.Uint32(rest[0:4])
		if uint64(ql) > uint64(len(rest)-4) {
			return bad()
		}
		queries = append(queries, string(rest[4:4+ql]))
		rest = rest[4+ql:]
	}
	if len(rest) != 0 {
		return bad()
	}
	if !c.nameMatches(name) {
		return c.optReply(opt, repErrUnknwn, nil)
	}
	_, can := c.s.exp.Backend.(ExtentLister)
	sel := false
	for _, q := range queries {
		sel = sel || q == metaBaseAllocation || (opt == optListMetaContext && q == "base:")
	}
	if opt == optListMetaContext && nq == 0 {
		sel = true // no query lists every context
	}
	sel = sel && can
	id := uint32(0) // LIST: reserved, zero
	if opt == optSetMetaContext {
		c.metaAlloc, id = sel, metaAllocID
	}
	if sel {
		b := binary.BigEndian.AppendUint32(nil, id)
		if err := c.optReply(opt, repMetaCtx, append(b, metaBaseAllocation...)); err != nil {
			return err
		}
	}
	return c.optReply(opt, repAck, nil)
}

func (c *conn) nameMatches(name string) bool { return name == "" || name == c.s.exp.Name }

// infoOrGo answers NBD_OPT_INFO/GO; done is true when transmission starts.
func (c *conn) infoOrGo(opt uint32, data []byte) (done bool, err error) {
	if len(data) < 6 {
		return false, c.optReply(opt, repErrInval, nil)
	}
	nameLen := binary.BigEndian.Uint32(data[0:4])
	if uint64(nameLen) > uint64(len(data)-6) {
		return false, c.optReply(opt, repErrInval, nil)
	}
	name := string(data[4 : 4+nameLen])
	rest := data[4+nameLen:]
	nreq := int(binary.BigEndian.Uint16(rest[0:2]))
	if len(rest) != 2+2*nreq {
		return false, c.optReply(opt, repErrInval, nil)
	}
	if !c.nameMatches(name) {
		return false, c.optReply(opt, repErrUnknwn, nil)
	}
	wantName, wantDesc := false, false
	for i := range nreq {
		switch binary.BigEndian.Uint16(rest[2+2*i:]) {
		case infoName:
			wantName = true
		case infoDescription:
			wantDesc = true
		}
	}
	info := binary.BigEndian.AppendUint16(nil, infoExport)
	info = binary.BigEndian.AppendUint64(info, c.size)
	info = binary.BigEndian.AppendUint16(info, c.s.transmissionFlags())
	if err := c.optReply(opt, repInfo, info); err != nil {
		return false, err
	}
	if wantName {
		b := append(binary.BigEndian.AppendUint16(nil, infoName), c.s.exp.Name...)
		if err := c.optReply(opt, repInfo, b); err != nil {
			return false, err
		}
	}
	if wantDesc && c.s.exp.Description != "" {
		b := append(binary.BigEndian.AppendUint16(nil, infoDescription), c.s.exp.Description...)
		if err := c.optReply(opt, repInfo, b); err != nil {
			return false, err
		}
	}
	bs := binary.BigEndian.AppendUint16(nil, infoBlockSize)
	bs = binary.BigEndian.AppendUint32(bs, minBlockSize)
	bs = binary.BigEndian.AppendUint32(bs, prefBlockSize)
	bs = binary.BigEndian.AppendUint32(bs, c.s.opts.MaxRequest)
	if err := c.optReply(opt, repInfo, bs); err != nil {
		return false, err
	}
	if err := c.optReply(opt, repAck, nil); err != nil {
		return false, err
	}
	return opt == optGo, nil
}

func (c *conn) optReply(opt, typ uint32, data []byte) error {
	b := make([]byte, 20, 20+len(data))
	binary.BigEndian.PutUint64(b[0:8], protocol.NEGOTIATION_MAGIC_REPLY)
	binary.BigEndian.PutUint32(b[8:12], opt)
	binary.BigEndian.PutUint32(b[12:16], typ)
	binary.BigEndian.PutUint32(b[16:20], uint32(len(data)))
	_, err := c.nc.Write(append(b, data...))
	return err
}
