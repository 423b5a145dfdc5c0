package nbdsrv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"os"
	"sync"

	"golang.org/x/sync/semaphore"
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
			if req.typ == cmdWrite {
				// The payload follows regardless: skip it without buffering.
				if _, err = io.CopyN(io.Discard, c.br, int64(req.length)); err != nil {
					break
				}
			}
			c.reply(req.handle, errno, nil)
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
		_, err = b.ReadAt(buf, off)
		if err == nil {
			c.reply(req.handle, 0, buf)
			return
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
		c.s.log.Warn("nbd request failed", "cmd", req.typ, "offset", off, "length", n, "err", err)
		c.reply(req.handle, errnoOf(err), nil)
		return
	}
	c.reply(req.handle, 0, nil)
}

// reply writes one simple reply (with read data) atomically on the wire.
// A write error closes the connection, which ends the request loop.
func (c *conn) reply(handle uint64, errno uint32, data []byte) {
	var hdr [replyHeaderLen]byte
	putReplyHeader(hdr[:], errno, handle)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return
	}
	var err error
	if errno == 0 && len(data) > 0 {
		bufs := net.Buffers{hdr[:], data}
		_, err = bufs.WriteTo(c.nc)
	} else {
		_, err = c.nc.Write(hdr[:])
	}
	if err != nil {
		c.werr = fmt.Errorf("write nbd reply: %w", err)
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			_ = c.nc.Close()
		}
	}
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
