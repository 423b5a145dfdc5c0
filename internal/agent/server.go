// Package agent is the in-guest agent: it serves exec, files and the
// readiness answer on a Unix socket the host can reach (runsc
// --host-uds=create, a bind-mounted socket directory), one call per
// connection in the framing of package wire.
package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/logging"
)

// DefaultPath is the PATH of an exec whose env has none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Server answers calls. Its fields are fixed before Serve.
type Server struct {
	// Nonce is the generation's readiness nonce (from a file ctld wrote,
	// never env or argv), the answer to OpReady.
	Nonce string
	// Started, when set, is waited for before OpReady is answered: it
	// returns once the workload's start is decided, with its error (the
	// answer is then CodeNotStarted). So an answer says the workload runs.
	Started func(context.Context) error
	// User is the workload's uid/gid: a call that names no user runs as it.
	User wire.User
	// FileCap bounds a file read or write (bytes); 0: 1 GiB.
	FileCap int64
	Reaper  *Reaper
	Logger  *slog.Logger
	// RequestTimeout bounds reading the first frame; 0: 10 s.
	RequestTimeout time.Duration

	// Claim, when set, makes this a warm agent (claim.go): the first
	// OpClaim starts the claim's workload through it.
	Claim func(ctx context.Context, c Claim) error
	// Hostnames says the Claim hook may set a claim's hostname; without
	// it a claim that names one is invalid.
	Hostnames bool

	readying atomic.Int32 // OpReady calls not yet answered

	mu         sync.Mutex
	claimTaken bool   // an OpClaim came (single use)
	claim      *Claim // the claim whose workload started
}

// Drain waits, at most d, until no OpReady call is waiting for its answer:
// an agent that exits because its workload could not start first gives
// the callers already waiting the reason.
func (s *Server) Drain(d time.Duration) {
	for t0 := time.Now(); s.readying.Load() > 0 && time.Since(t0) < d; {
		time.Sleep(time.Millisecond)
	}
}

func (s *Server) log() *slog.Logger { return logging.OrDiscard(s.Logger) }

func (s *Server) fileCap() int64 {
	if s.FileCap <= 0 {
		return 1 << 30
	}
	return s.FileCap
}

// Serve accepts connections until ctx ends or the listener is closed.
// Any other accept error (EMFILE, ECONNABORTED, ...) is waited out: an
// agent that stopped accepting would leave its guest unreachable for as
// long as the workload runs.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	if s.Reaper == nil {
		return errors.New("agent serve: no reaper")
	}
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("agent accept: %w", err)
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log().Warn("agent: accept failed; accepting again", "err", err, "after", backoff)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		go s.handle(ctx, c)
	}
}

// conn serialises the frames of one call's writers; its reads go through
// r (a frame's header and payload, and the frames queued behind it, in
// one read where they are there: every syscall of the guest traps into
// the sentry).
type conn struct {
	c  net.Conn
	r  *bufio.Reader
	mu sync.Mutex
}

// fileChunk is what a file read or write moves per syscall on the file
// and (at most) on the socket: 16 frames. Each syscall of a guest under
// ptrace costs host context switches; per 64 KiB frame they were most of
// a file call's time.
const fileChunk = 16 * wire.MaxPayload

// blocking puts the connection's socket in blocking mode for a file
// stream: a read or write then waits inside the sentry until it can go
// on, where on a non-blocking socket each wait is EAGAIN, epoll and a
// futex wake-up, all syscalls that trap (under ptrace the socket's buffer
// fills several times per MiB). Deadlines no longer apply: a file stream
// has none here, and it ends when the caller closes the connection.
func (c *conn) blocking() {
	sc, ok := c.c.(syscall.Conn)
	if !ok {
		return // not a socket (tests): nothing to gain
	}
	if rc, err := sc.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.SetNonblock(int(fd), false) })
	}
}

func (c *conn) writeRaw(b []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := c.c.Write(b)
	return err
}

func (c *conn) write(t wire.Type, p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return wire.WriteFrame(c.c, t, p)
}

func (c *conn) json(t wire.Type, v any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return wire.WriteJSON(c.c, t, v)
}

func (c *conn) fail(code, format string, a ...any) error {
	return c.json(wire.TError, wire.Error{Code: code, Message: fmt.Sprintf(format, a...)})
}

func (c *conn) failErr(op string, err error) error {
	code := wire.CodeInternal
	switch {
	case errors.Is(err, fs.ErrNotExist):
		code = wire.CodeNotFound
	case errors.Is(err, fs.ErrPermission):
		code = wire.CodePermission
	case errors.Is(err, fs.ErrExist):
		code = wire.CodeExists
	}
	return c.fail(code, "%s: %v", op, err)
}

func (s *Server) handle(ctx context.Context, nc net.Conn) {
	defer nc.Close()
	c := &conn{c: nc, r: bufio.NewReader(nc)}
	to := s.RequestTimeout
	if to <= 0 {
		to = 10 * time.Second
	}
	nc.SetReadDeadline(time.Now().Add(to))
	t, p, err := wire.ReadFrame(c.r, nil, wire.MaxPayload)
	if err != nil {
		s.log().Debug("read request", "err", err)
		return
	}
	nc.SetReadDeadline(time.Time{})
	var req wire.Request
	if t != wire.TRequest {
		c.fail(wire.CodeInvalid, "first frame %q is not a request", t)
		return
	}
	if err := wire.Decode(p, &req); err != nil {
		c.fail(wire.CodeInvalid, "request: %v", err)
		return
	}
	nonce, u := s.identity()
	if req.User != nil {
		u = *req.User
	}
	switch req.Op {
	case wire.OpClaim:
		s.handleClaim(ctx, c, req)
	case wire.OpReady:
		s.readying.Add(1)
		defer s.readying.Add(-1)
		if s.Started != nil {
			if err := s.Started(ctx); err != nil {
				c.fail(wire.CodeNotStarted, "the workload did not start: %v", err)
				return
			}
		}
		c.json(wire.TResult, wire.Ready{Nonce: nonce})
	case wire.OpExec:
		s.exec(ctx, c, req, u)
	case wire.OpRead:
		s.read(c, req, u)
	case wire.OpWrite:
		s.write(c, req, u)
	case wire.OpStat, wire.OpList, wire.OpMkdir, wire.OpRemove, wire.OpRename:
		s.fileOp(c, req, u)
	default:
		c.fail(wire.CodeInvalid, "unknown op %q", req.Op)
	}
}

// lookPath finds args[0] on the PATH of env, as execvp would.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := DefaultPath
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w in PATH", name, fs.ErrNotExist)
}

// credential is what a child runs as. A non-root agent (host tests) cannot
// set groups; it can only run as itself.
func credential(u wire.User) *syscall.Credential {
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}, NoSetGroups: os.Getuid() != 0}
}

// exec runs one command. Its process group (on a PTY: its session, where a
// shell's job control puts jobs in groups of their own) is killed when it
// exits, when it times out and when the caller goes away: an exec leaves no
// process but one that left on purpose (setsid, or `set -m` without a PTY).
func (s *Server) exec(ctx context.Context, c *conn, req wire.Request, u wire.User) {
	if len(req.Args) == 0 {
		c.fail(wire.CodeInvalid, "exec: no args")
		return
	}
	argv0, err := lookPath(req.Args[0], req.Env)
	if err != nil {
		c.failErr("exec", err)
		return
	}
	env := req.Env
	if len(env) == 0 {
		env = []string{"PATH=" + DefaultPath}
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = "/"
	}
	attr := &syscall.ProcAttr{Dir: cwd, Env: env, Sys: &syscall.SysProcAttr{Credential: credential(u), Setpgid: true}}
	var (
		childFDs  []int // the child's ends, closed once it started
		stdin     io.WriteCloser
		outs      []*os.File // what we read: stdout, stderr (or the PTY master)
		ptyMaster *os.File
	)
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	closeFDs := func(fds []int) {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	if req.TTY {
		m, sl, err := openPTY()
		if err != nil {
			c.failErr("exec: open pty", err)
			return
		}
		if req.Rows > 0 && req.Cols > 0 {
			setWinsize(m, req.Rows, req.Cols)
		}
		ptyMaster, stdin, outs, childFDs = m, m, []*os.File{m}, []int{sl}
		attr.Files = []uintptr{uintptr(sl), uintptr(sl), uintptr(sl)}
		attr.Sys.Setpgid = false
		attr.Sys.Setsid, attr.Sys.Setctty, attr.Sys.Ctty = true, true, 0
	} else {
		var ours [3]*os.File
		for i := range ours {
			f, fd, err := pipe(i > 0)
			if err != nil {
				closeAll(ours[:i])
				closeFDs(childFDs)
				c.failErr("exec: pipe", err)
				return
			}
			ours[i], childFDs = f, append(childFDs, fd)
		}
		stdin, outs = ours[0], ours[1:]
		attr.Files = []uintptr{uintptr(childFDs[0]), uintptr(childFDs[1]), uintptr(childFDs[2])}
	}
	// Every path below ends by closing ours: a reader blocked on one
	// returns (each is on the poller), and no descriptor outlives the call.
	release := func() {
		closeAll(outs)
		if ptyMaster == nil {
			stdin.Close()
		}
	}
	pid, done, err := s.Reaper.Start(argv0, req.Args, attr)
	closeFDs(childFDs)
	if err != nil {
		release()
		c.failErr("exec "+req.Args[0], err)
		return
	}
	// pid leads its own group (Setpgid), on a PTY its own session
	// (Setsid); every path below kills them once (killExec).

	// Output: one goroutine per stream keeps each stream's order; each
	// says when its stream ended.
	eof := make(chan struct{}, len(outs))
	for i, f := range outs {
		t := wire.TStdout
		if i == 1 {
			t = wire.TStderr
		}
		go func() {
			defer func() { eof <- struct{}{} }()
			buf := make([]byte, 32<<10)
			send := func(p []byte) bool { return c.write(t, p) == nil }
			for {
				n, err := f.Read(buf)
				if n > 0 && !send(buf[:n]) {
					return
				}
				if errors.Is(err, os.ErrDeadlineExceeded) {
					// Cut (see below): what is queued now is the rest.
					drainQueued(f, buf, send)
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}

	// Input: stdin, resize, signals; EOF or an error = the caller is gone.
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		var buf []byte
		for {
			t, p, err := wire.ReadFrame(c.r, buf, wire.MaxPayload)
			if err != nil {
				return
			}
			buf = p[:0]
			switch t {
			case wire.TStdin:
				if _, err := stdin.Write(p); err != nil {
					s.log().Debug("write stdin", "err", err)
				}
			case wire.TStdinClose:
				if ptyMaster == nil {
					stdin.Close() // closing twice is harmless
				}
			case wire.TResize:
				var r wire.Resize
				if ptyMaster != nil && wire.Decode(p, &r) == nil {
					setWinsize(ptyMaster, r.Rows, r.Cols)
				}
			case wire.TSignal:
				var sg wire.Signal
				if wire.Decode(p, &sg) == nil && sg.Signal > 0 && sg.Signal < 65 {
					unix.Kill(-pid, unix.Signal(sg.Signal))
				}
			default:
				return
			}
		}
	}()

	var timeout <-chan time.Time
	if req.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	var (
		ws       syscall.WaitStatus
		timedOut bool
	)
	select {
	case ws = <-done:
	case <-timeout:
		timedOut = true
		killExec(pid, ptyMaster != nil)
		ws = <-done
	case <-gone:
		// Nobody to deliver to: the group, then ours, at once.
		killExec(pid, ptyMaster != nil)
		<-done
		release()
		for range outs {
			<-eof
		}
		return
	case <-ctx.Done():
		killExec(pid, ptyMaster != nil)
		<-done
		release()
		for range outs {
			<-eof
		}
		return
	}
	// The command is over: so is its group (a background child would
	// otherwise hold the output open and outlive the call).
	if !timedOut {
		killExec(pid, ptyMaster != nil)
	}
	// The output ends once drained (no holder of the pipes or the PTY's
	// slave is left): usually at once. A PTY whose master reports no
	// hangup will not end by itself: gVisor's master never does (a read
	// never fails with EIO once no slave is open), and on Linux a process
	// that left the group still holds the slave. Its output is cut now,
	// after what is queued: a slave write completes into the master's
	// queue (in gVisor; on Linux the hangup case, which waits for EIO,
	// covers the kernel's deferred push), so nothing the command wrote
	// is lost. A process that left the group (setsid) may still hold the
	// pipes: after a grace, their output is cut.
	if ptyMaster != nil && !hungUp(ptyMaster) {
		ptyMaster.SetReadDeadline(time.Now())
	}
	pending := len(outs)
	for pending > 0 && len(eof) > 0 {
		<-eof
		pending--
	}
	if pending > 0 {
		grace := time.NewTimer(outputGrace)
	drain:
		for ; pending > 0; pending-- {
			select {
			case <-eof:
			case <-grace.C:
				s.log().Info("exec output still held after the command ended; cutting it", "args", req.Args)
				break drain
			}
		}
		grace.Stop()
	}
	release()
	for ; pending > 0; pending-- {
		<-eof
	}
	code, sig := exitOf(ws)
	c.json(wire.TExit, wire.Exit{Code: code, Signal: sig, TimedOut: timedOut})
}

// pipe makes a pipe for a child: the child's end (a blocking descriptor,
// close-on-exec until ForkExec dups it) and ours (non-blocking, on the
// poller). os.Pipe would register both ends with the poller and Fd would
// set the child's back to blocking: four fcntl and two epoll_ctl more per
// pipe, each a trap into the sentry under gVisor's ptrace platform.
func pipe(parentReads bool) (ours *os.File, child int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, -1, err
	}
	o, ch := p[1], p[0]
	if parentReads {
		o, ch = p[0], p[1]
	}
	// A pipe has no other status flag to keep.
	if _, err := unix.FcntlInt(uintptr(o), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		unix.Close(o)
		unix.Close(ch)
		return nil, -1, err
	}
	return os.NewFile(uintptr(o), "pipe"), ch, nil
}

// openPTY opens a new pseudo-terminal pair through /dev/ptmx: the master
// on the poller (non-blocking: a close or a read deadline ends a read in
// progress; its Fd is never called, which would make it blocking), the
// slave a plain descriptor for the child (blocking, close-on-exec until
// ForkExec dups it).
func openPTY() (master *os.File, slave int, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, -1, err
	}
	// A master off the poller could block its reader for good.
	if err := m.SetReadDeadline(time.Time{}); err != nil {
		m.Close()
		return nil, -1, fmt.Errorf("pty master not pollable: %w", err)
	}
	var n int
	err = control(m, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlock pty: %w", err)
		}
		var err error
		if n, err = unix.IoctlGetInt(fd, unix.TIOCGPTN); err != nil {
			return fmt.Errorf("pty number: %w", err)
		}
		return nil
	})
	if err != nil {
		m.Close()
		return nil, -1, err
	}
	sl, err := unix.Open(fmt.Sprintf("/dev/pts/%d", n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		m.Close()
		return nil, -1, fmt.Errorf("open pty slave %d: %w", n, err)
	}
	return m, sl, nil
}

// control runs fn on f's descriptor without taking it off the poller.
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// setWinsize sets a PTY's size (the child sees it, and SIGWINCH where the
// kernel sends one).
func setWinsize(master *os.File, rows, cols uint16) {
	control(master, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	})
}

// hungUp says whether a PTY master reports that no slave is open (POLLHUP):
// then a read fails with EIO once the queue is drained.
func hungUp(master *os.File) bool {
	hup := false
	control(master, func(fd int) error {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(p, 0)
		hup = err == nil && n > 0 && p[0].Revents&unix.POLLHUP != 0
		return err
	})
	return hup
}

// drainQueued sends what f's (non-blocking) descriptor holds now, until a
// read would block or fails (EIO: a PTY master without a slave).
func drainQueued(f *os.File, buf []byte, send func([]byte) bool) {
	control(f, func(fd int) error {
		for {
			n, err := unix.Read(fd, buf)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if n <= 0 || !send(buf[:n]) {
				return err
			}
		}
	})
}

// asUser runs fn on an OS thread whose effective uid/gid are u's and which
// has no supplementary groups, so file calls are checked as that user (a
// non-zero euid holds no effective capability). Raw syscalls change only
// the calling thread (setfsgid did not take effect under runsc; setresuid is per task there
// too). The thread is never unlocked: it exits with the goroutine, and its
// changed credentials never serve another goroutine.
func asUser(u wire.User, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if os.Getuid() == 0 {
			keep := ^uintptr(0) // -1: leave unchanged
			if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
				errc <- fmt.Errorf("setgroups: %w", e)
				return
			}
			if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(u.GID), keep); e != 0 {
				errc <- fmt.Errorf("setresgid %d: %w", u.GID, e)
				return
			}
			if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(u.UID), keep); e != 0 {
				errc <- fmt.Errorf("setresuid %d: %w", u.UID, e)
				return
			}
			if id, _, _ := unix.RawSyscall(unix.SYS_GETEUID, 0, 0, 0); uint32(id) != u.UID {
				errc <- fmt.Errorf("thread euid %d, want %d", id, u.UID)
				return
			}
		} else if uint32(os.Getuid()) != u.UID {
			errc <- fmt.Errorf("agent runs as uid %d, cannot act as uid %d: %w", os.Getuid(), u.UID, fs.ErrPermission)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func (s *Server) limit(req wire.Request) int64 {
	if req.Limit > 0 && req.Limit < s.fileCap() {
		return req.Limit
	}
	return s.fileCap()
}

// read streams a regular file in Data frames, then End. A file over the
// limit is refused before any byte is sent when its size says so, and
// stopped with an Error when it grows past it.
func (s *Server) read(c *conn, req wire.Request, u wire.User) {
	var f *os.File
	err := asUser(u, func() error {
		// What is not a regular file is refused before it is opened (a
		// socket cannot be, a FIFO would wait for a writer).
		if fi, err := os.Stat(req.Path); err != nil {
			return err
		} else if !fi.Mode().IsRegular() {
			return notRegular(fi.Mode())
		}
		var err error
		f, err = os.OpenFile(req.Path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
		return err
	})
	var nr notRegular
	if errors.As(err, &nr) {
		c.fail(wire.CodeInvalid, "read %s: %v", req.Path, nr)
		return
	}
	if err != nil {
		c.failErr("open "+req.Path, err)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		c.failErr("stat "+req.Path, err)
		return
	}
	if !st.Mode().IsRegular() {
		c.fail(wire.CodeInvalid, "read %s: %v", req.Path, notRegular(st.Mode()))
		return
	}
	max := s.limit(req)
	if st.Size() > max {
		c.fail(wire.CodeTooLarge, "read %s: %d bytes, limit %d", req.Path, st.Size(), max)
		return
	}
	c.blocking()
	var (
		frames = make([]byte, fileChunk/wire.MaxPayload*slot)
		iov    = make([][]byte, fileChunk/wire.MaxPayload)
		total  int64
	)
	for i := range iov {
		iov[i] = frames[i*slot+wire.HeaderLen : (i+1)*slot]
	}
	for {
		out, n, err := readFrames(f, frames, iov)
		if n > 0 {
			total += int64(n)
			if total > max {
				c.fail(wire.CodeTooLarge, "read %s: past limit %d", req.Path, max)
				return
			}
			if c.writeRaw(out) != nil {
				return
			}
		}
		if err == io.EOF {
			c.write(wire.TEnd, nil)
			return
		}
		if err != nil {
			c.failErr("read "+req.Path, err)
			return
		}
	}
}

// slot is a frame of a full payload.
const slot = wire.HeaderLen + wire.MaxPayload

// readFrames reads f into the payload slots iov of frames (laid out as
// slots) with one readv, fills in the headers of the Data frames read and
// returns them: one read and one write move up to fileChunk, with no copy.
// At the end of f it returns io.EOF with nothing read.
func readFrames(f *os.File, frames []byte, iov [][]byte) ([]byte, int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, 0, err
	}
	var n int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = unix.Readv(int(fd), iov)
			if rerr != unix.EINTR {
				return true // a regular file does not wait (EAGAIN)
			}
		}
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return nil, 0, err
	}
	if n == 0 {
		return nil, 0, io.EOF
	}
	full, rest := n/wire.MaxPayload, n%wire.MaxPayload
	for i := range full {
		wire.PutHeader(frames[i*slot:], wire.TData, wire.MaxPayload)
	}
	end := full * slot
	if rest > 0 {
		wire.PutHeader(frames[end:], wire.TData, rest)
		end += wire.HeaderLen + rest
	}
	return frames[:end], n, nil
}

// write takes Data frames until End into a temp file next to the path and
// renames it over the path, so a refused or broken write leaves the old
// file as it was.
func (s *Server) write(c *conn, req wire.Request, u wire.User) {
	mode := fs.FileMode(req.Mode).Perm()
	if mode == 0 {
		mode = 0o644
	}
	var f *os.File
	target := req.Path
	err := asUser(u, func() error {
		// The file is replaced by a rename: through a symlink, the file it
		// names; anything but a regular file there is refused (a FIFO or a
		// device is not replaced by a file).
		if fi, err := os.Lstat(target); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = filepath.EvalSymlinks(target); err != nil {
				return err
			}
		}
		if fi, err := os.Stat(target); err == nil && !fi.Mode().IsRegular() {
			return notRegular(fi.Mode())
		}
		var err error
		f, err = os.CreateTemp(filepath.Dir(target), ".ctl-agent-*")
		return err
	})
	var nr notRegular
	if errors.As(err, &nr) {
		c.fail(wire.CodeInvalid, "write %s: %v", req.Path, nr)
		return
	}
	if err != nil {
		c.failErr("create "+req.Path, err)
		return
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	max := s.limit(req)
	var total int64
	c.blocking()
	// Frames come in reads of up to fileChunk and go to the file in writes
	// of fileChunk, with the payloads used where they were read.
	r := bufio.NewReaderSize(c.r, fileChunk)
	w := bufio.NewWriterSize(f, fileChunk)
	for {
		t, p, err := wire.NextFrame(r, wire.MaxPayload)
		if err != nil {
			return // the caller is gone: nothing is replaced
		}
		switch t {
		case wire.TData:
			total += int64(len(p))
			if total > max {
				c.fail(wire.CodeTooLarge, "write %s: past limit %d", req.Path, max)
				return
			}
			if _, err := w.Write(p); err != nil {
				c.failErr("write "+req.Path, err)
				return
			}
		case wire.TEnd:
			if err := w.Flush(); err != nil {
				c.failErr("write "+req.Path, err)
				return
			}
			if err := f.Chmod(mode); err != nil {
				c.failErr("chmod "+req.Path, err)
				return
			}
			if err := f.Close(); err != nil {
				c.failErr("close "+req.Path, err)
				return
			}
			if err := asUser(u, func() error { return os.Rename(tmp, target) }); err != nil {
				c.failErr("rename "+req.Path, err)
				return
			}
			ok = true
			c.json(wire.TResult, wire.Written{Bytes: total})
			return
		default:
			c.fail(wire.CodeInvalid, "write %s: unexpected frame %q", req.Path, t)
			return
		}
	}
}

// outputGrace is how long an exec's output may stay open after the
// command and its group ended.
const outputGrace = 2 * time.Second

// MaxList bounds the entries of one OpList answer.
const MaxList = 100000

func statOf(name string, fi fs.FileInfo, full string) wire.Stat {
	st := wire.Stat{Name: name, Size: fi.Size(), Mode: uint32(fi.Mode()), ModUnix: fi.ModTime().Unix()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.UID, st.GID = sys.Uid, sys.Gid
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		st.Link, _ = os.Readlink(full)
	}
	return st
}

func (s *Server) fileOp(c *conn, req wire.Request, u wire.User) {
	if req.Path == "" {
		c.fail(wire.CodeInvalid, "%s: no path", req.Op)
		return
	}
	var result any
	err := asUser(u, func() error {
		switch req.Op {
		case wire.OpStat:
			fi, err := os.Lstat(req.Path)
			if err != nil {
				return err
			}
			result = statOf(filepath.Base(req.Path), fi, req.Path)
		case wire.OpList:
			d, err := os.Open(req.Path)
			if err != nil {
				return err
			}
			defer d.Close()
			var list []wire.Stat
			for {
				es, err := d.ReadDir(1024)
				for _, e := range es {
					fi, err := e.Info()
					if err != nil {
						continue // gone meanwhile
					}
					list = append(list, statOf(e.Name(), fi, filepath.Join(req.Path, e.Name())))
					if len(list) > MaxList {
						return fmt.Errorf("list %s: more than %d entries: %w", req.Path, MaxList, errTooMany)
					}
				}
				if err == io.EOF || len(es) == 0 {
					break
				}
				if err != nil {
					return err
				}
			}
			result = list
		case wire.OpMkdir:
			mode := fs.FileMode(req.Mode).Perm()
			if mode == 0 {
				mode = 0o755
			}
			if req.Recursive {
				return os.MkdirAll(req.Path, mode)
			}
			return os.Mkdir(req.Path, mode)
		case wire.OpRemove:
			if req.Recursive {
				return os.RemoveAll(req.Path)
			}
			return os.Remove(req.Path)
		case wire.OpRename:
			if req.NewPath == "" {
				return fmt.Errorf("rename: no new path: %w", errInvalid)
			}
			return os.Rename(req.Path, req.NewPath)
		}
		return nil
	})
	switch {
	case errors.Is(err, errTooMany):
		c.fail(wire.CodeTooLarge, "%v", err)
	case errors.Is(err, errInvalid):
		c.fail(wire.CodeInvalid, "%v", err)
	case err != nil:
		c.failErr(req.Op+" "+req.Path, err)
	case req.Op == wire.OpList:
		// Entries in frames of a bounded size, then End.
		list, _ := result.([]wire.Stat)
		batch := []byte{'['}
		flush := func() bool {
			if len(batch) == 1 {
				return true
			}
			batch[len(batch)-1] = ']'
			ok := c.write(wire.TData, batch) == nil
			batch = append(batch[:0], '[')
			return ok
		}
		for _, e := range list {
			b, err := json.Marshal(e)
			if err != nil {
				c.fail(wire.CodeInternal, "encode entry: %v", err)
				return
			}
			if len(batch)+len(b)+1 > wire.MaxPayload && !flush() {
				return
			}
			batch = append(append(batch, b...), ',')
		}
		if !flush() {
			return
		}
		c.write(wire.TEnd, nil)
	default:
		c.json(wire.TResult, result)
	}
}

var (
	errTooMany = errors.New("too many entries")
	errInvalid = errors.New("invalid request")
)

// notRegular refuses a file that is not a regular one, naming its kind.
type notRegular fs.FileMode

func (m notRegular) Error() string {
	kind := "special file"
	switch t := fs.FileMode(m).Type(); {
	case t&fs.ModeDir != 0:
		kind = "directory"
	case t&fs.ModeNamedPipe != 0:
		kind = "FIFO"
	case t&fs.ModeSocket != 0:
		kind = "socket"
	case t&fs.ModeCharDevice != 0:
		kind = "character device"
	case t&fs.ModeDevice != 0:
		kind = "block device"
	case t&fs.ModeSymlink != 0:
		kind = "symlink"
	}
	return "not a regular file (" + kind + ")"
}
