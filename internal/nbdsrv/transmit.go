package nbdsrv

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"os"
	"sync"

	"golang.org/x/sync/semaphore"
	"golang.org/x/sys/unix"
)

// transmit reads requests in order and serves each in its own goroutine,
// within the connection's in-flight bounds; replies go out in completion
// order. It returns when the client disconnects, breaks the protocol or ctx
// ends, after every started request has been answered.
func (c *conn) transmit(ctx context.Context) error {
	opts := c.s.opts
	slots := make(chan struct{}, opts.MaxInFlight)
	budget := semaphore.NewWeighted(opts.MaxInFlightBytes)
	var wg sync.WaitGroup
	// Workers must not outlive the connection: wait for them on every path.
	defer wg.Wait()

	var hdr [requestHeaderLen]byte
	var err error
	graceful := false
	for {
		if _, err = io.ReadFull(c.br, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				err = nil
			}
			break
		}
		req, ok := parseRequest(hdr[:])
		if !ok {
			err = fmt.Errorf("%w: bad request magic", errProtocol)
			break
		}
		if req.typ == cmdDisc {
			graceful = true
			break
		}
		if errno := c.check(req); errno != 0 {
			c.s.errs.refused.Add(1)
			if req.typ == cmdWrite {
				// The payload follows regardless: skip it without buffering.
				if _, err = io.CopyN(io.Discard, c.br, int64(req.length)); err != nil {
					break
				}
			}
			c.reply(req, errno, nil)
			continue
		}
		// Bounds first, then buffers: a client that sends faster than the
		// backend serves waits here, its requests unread in the socket.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		weight := int64(0)
		if req.typ == cmdRead || req.typ == cmdWrite {
			weight = int64(req.length)
		}
		if err = budget.Acquire(ctx, weight); err != nil {
			<-slots
			err = nil
			break
		}
		var buf []byte
		if weight > 0 {
			buf = c.s.pool.get(int(req.length))
		}
		if req.typ == cmdWrite {
			if _, err = io.ReadFull(c.br, buf); err != nil {
				c.s.pool.put(buf)
				budget.Release(weight)
				<-slots
				if ctx.Err() != nil {
					err = nil
				}
				break
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			defer budget.Release(weight)
			defer c.s.pool.put(buf)
			c.serve(req, buf)
		}()
	}
	wg.Wait()
	if !c.s.exp.ReadOnly && (graceful || ctx.Err() != nil) {
		// What was acknowledged reaches the disk even if the client
		// disconnects without a FLUSH.
		if serr := c.s.exp.Backend.Sync(); serr != nil {
			err = errors.Join(err, fmt.Errorf("sync at disconnect: %w", serr))
		}
	}
	c.wmu.Lock()
	werr := c.werr
	c.wmu.Unlock()
	if werr != nil && err == nil && ctx.Err() == nil {
		err = werr
	}
	return err
}

// check validates a request before anything is allocated for it; it
// returns the NBD error to answer with, or 0.
func (c *conn) check(req request) uint32 {
	ro := c.s.exp.ReadOnly
	allowed := cmdFlagFUA // FUA is valid on every command (ignored on reads)
	switch req.typ {
	case cmdRead:
	case cmdWrite, cmdTrim:
		if ro {
			return errPerm
		}
	case cmdWriteZeroes:
		if ro {
			return errPerm
		}
		allowed |= cmdFlagNoHole
	case cmdFlush:
		if req.offset != 0 || req.length != 0 {
			return errInval
		}
	case cmdBlockStatus:
		if !c.metaAlloc {
			return errInval // no metadata context selected
		}
		allowed |= cmdFlagReqOne
	default:
		return errInval
	}
	if req.flags&^allowed != 0 {
		return errInval
	}
	if req.typ == cmdFlush {
		return 0
	}
	if req.length == 0 {
		return errInval
	}
	if (req.typ == cmdRead || req.typ == cmdWrite) && req.length > c.s.opts.MaxRequest {
		return errOverflow
	}
	// No overflow: offset is compared before the subtraction.
	if req.offset > c.size || uint64(req.length) > c.size-req.offset {
		if req.typ == cmdWrite || req.typ == cmdWriteZeroes {
			return errNoSpc
		}
		return errInval
	}
	return 0
}

// serve runs one checked request against the backend and replies.
func (c *conn) serve(req request, buf []byte) {
	b := c.s.exp.Backend
	off, n := int64(req.offset), int64(req.length)
	var err error
	switch req.typ {
	case cmdRead:
		if fr, ok := b.(FileReader); ok && c.raw != nil {
			if segs, ok := fr.ReadFiles(nil, off, int(n)); ok {
				c.replyFiles(req, segs)
				return
			}
		}
		_, err = b.ReadAt(buf, off)
		if err == nil {
			c.reply(req, 0, buf)
			return
		}
	case cmdBlockStatus:
		var exts []Extent
		// check allowed it only with the context, i.e. an ExtentLister.
		exts, err = b.(ExtentLister).Extents(off, n)
		if err == nil {
			var desc []byte
			if desc, err = blockStatus(exts, n, req.flags&cmdFlagReqOne != 0); err == nil {
				c.reply(req, 0, desc)
				return
			}
		}
	case cmdWrite:
		_, err = b.WriteAt(buf, off)
	case cmdFlush:
		err = b.Sync()
	case cmdTrim:
		err = b.Trim(off, n)
	case cmdWriteZeroes:
		err = b.WriteZeroes(off, n, req.flags&cmdFlagNoHole != 0)
	}
	if err == nil && req.flags&cmdFlagFUA != 0 && req.typ != cmdRead && req.typ != cmdFlush {
		err = b.Sync()
	}
	if err != nil {
		c.s.errs.backend(req.typ)
		c.s.log.Warn("nbd request failed", "cmd", req.typ, "offset", off, "length", n, "err", err)
		c.reply(req, errnoOf(err), nil)
		return
	}
	c.reply(req, 0, nil)
}

// maxExtents bounds the descriptors of one BLOCK_STATUS reply (the client
// asks again for the rest).
const maxExtents = 1 << 14

// blockStatus encodes exts as the payload of a base:allocation reply chunk
// for a request of n bytes: the context id, then (length, flags) pairs,
// lengths summing to at most n, at least one.
func blockStatus(exts []Extent, n int64, one bool) ([]byte, error) {
	b := binary.BigEndian.AppendUint32(make([]byte, 0, 4+8*min(len(exts), maxExtents)), metaAllocID)
	sum := int64(0)
	for _, e := range exts {
		if e.Length <= 0 || e.Length > n-sum || len(b) >= 4+8*maxExtents {
			break
		}
		flags := uint32(0)
		if e.Hole {
			flags |= stateHole
		}
		if e.Zero {
			flags |= stateZero
		}
		b = binary.BigEndian.AppendUint32(b, uint32(e.Length))
		b = binary.BigEndian.AppendUint32(b, flags)
		sum += e.Length
		if one {
			break
		}
	}
	if len(b) == 4 {
		return nil, fmt.Errorf("block status: no extent of [%d bytes]: %w", n, unix.EIO)
	}
	return b, nil
}

// reply writes one reply to req atomically on the wire: a simple reply
// (with read data), or, with structured replies negotiated, one chunk with
// the DONE flag for READ and BLOCK_STATUS (data or an error: the protocol
// allows no simple reply to them then). A write error closes the
// connection, which ends the request loop.
func (c *conn) reply(req request, errno uint32, data []byte) {
	var hdr [structuredHeaderLen + 8]byte
	var head []byte
	switch {
	case !c.structured || (req.typ != cmdRead && req.typ != cmdBlockStatus):
		putReplyHeader(hdr[:], errno, req.handle)
		head = hdr[:replyHeaderLen]
		if errno != 0 {
			data = nil
		}
	case errno != 0:
		// NBD_REPLY_TYPE_ERROR: the error, an empty message.
		putChunkHeader(hdr[:], replyFlagDone, replyTypeError, req.handle, 6)
		binary.BigEndian.PutUint32(hdr[20:24], errno)
		head, data = hdr[:26], nil
	case req.typ == cmdRead:
		putChunkHeader(hdr[:], replyFlagDone, replyTypeOffsetData, req.handle, uint32(8+len(data)))
		binary.BigEndian.PutUint64(hdr[20:28], req.offset)
		head = hdr[:28]
	default: // block status: data is the descriptors' payload
		putChunkHeader(hdr[:], replyFlagDone, replyTypeBlockStat, req.handle, uint32(len(data)))
		head = hdr[:structuredHeaderLen]
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return
	}
	var err error
	if len(data) > 0 {
		bufs := net.Buffers{head, data}
		_, err = bufs.WriteTo(c.nc)
	} else {
		_, err = c.nc.Write(head)
	}
	if err != nil {
		c.werr = fmt.Errorf("write nbd reply: %w", err)
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			_ = c.nc.Close()
		}
	}
}

// replyFiles answers a read from file segments: the reply's header, then
// each segment sent with sendfile(2). A failure after the header cannot be
// told to the client: the connection is closed (the kernel's client
// reconnects or fails the request).
func (c *conn) replyFiles(req request, segs []FileSegment) {
	var hdr [structuredHeaderLen + 8]byte
	head := hdr[:replyHeaderLen]
	if c.structured {
		putChunkHeader(hdr[:], replyFlagDone, replyTypeOffsetData, req.handle, uint32(8+req.length))
		binary.BigEndian.PutUint64(hdr[20:28], req.offset)
		head = hdr[:28]
	} else {
		putReplyHeader(hdr[:], 0, req.handle)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return
	}
	_, err := c.nc.Write(head)
	for _, sg := range segs {
		if err != nil {
			break
		}
		err = c.sendfile(sg)
	}
	if err != nil {
		c.werr = fmt.Errorf("write nbd reply: %w", err)
		_ = c.nc.Close()
	}
}

// sendfile sends segment sg on the connection's socket, waiting for room
// in it as a write would (deadlines included).
func (c *conn) sendfile(sg FileSegment) error {
	off, left := sg.Off, sg.Len
	var serr error
	err := c.raw.Write(func(fd uintptr) bool {
		for left > 0 {
			n, err := unix.Sendfile(int(fd), sg.Fd, &off, left)
			if n > 0 {
				left -= n
			}
			switch {
			case err == unix.EAGAIN:
				return false // wait until the socket is writable
			case err == unix.EINTR:
			case err != nil:
				serr = fmt.Errorf("sendfile: %w", err)
				return true
			case n == 0:
				serr = fmt.Errorf("sendfile: %w", io.ErrUnexpectedEOF)
				return true
			}
		}
		return true
	})
	return errors.Join(err, serr)
}

// bufPool recycles payload buffers by power-of-two size class.
type bufPool struct {
	classes []sync.Pool
}

const minClassShift = 12 // 4 KiB

func (p *bufPool) init(maxSize int) {
	p.classes = make([]sync.Pool, classOf(maxSize)+1)
}

func classOf(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}

func (p *bufPool) get(n int) []byte {
	cl := classOf(n)
	if v, ok := p.classes[cl].Get().(*[]byte); ok {
		return (*v)[:n]
	}
	return make([]byte, n, 1<<(cl+minClassShift))
}

func (p *bufPool) put(b []byte) {
	if b == nil {
		return
	}
	cl := classOf(cap(b))
	if cl >= len(p.classes) || cap(b) != 1<<(cl+minClassShift) {
		return
	}
	b = b[:cap(b)]
	p.classes[cl].Put(&b)
}
