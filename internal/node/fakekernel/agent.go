package fakekernel

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/agent"
	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/runsc"
)

// fakeAgent stands in for ctl-agent in a started container whose spec runs
// it: it listens in the spec's agent socket dir (as runsc --host-uds=create
// lets the real one) and answers ready with the nonce it reads (and
// removes) from the socket dir's nonce file, as the real one does, exec of the
// fake guest's commands (fakeCommand), and the file calls on the
// container's root dir (os.Root: the guest's view cannot leave it). It
// ignores users. FailMake(KindExec, id) makes it refuse every call.
type fakeAgent struct {
	k      *Kernel
	id     string
	root   string
	l      net.Listener
	closed sync.Once
	// warm is an agent started with --warm (a warm pool member's): its
	// one claim call replaces the nonce, as the real one's does.
	warm bool

	mu      sync.Mutex
	nonce   string
	claimed bool
}

// startAgent starts c's agent if its spec has one.
func (k *Kernel) startAgent(c *container) error {
	b, err := os.ReadFile(filepath.Join(c.bundle, "config.json"))
	if err != nil {
		return err
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil || s.Process == nil || s.Root == nil {
		return fmt.Errorf("bad spec: %v", err)
	}
	if len(s.Process.Args) == 0 || s.Process.Args[0] != path.Join(runsc.AgentBinDir, runsc.AgentBinary) {
		return nil
	}
	a := &fakeAgent{k: k, id: c.id, root: s.Root.Path, warm: slices.Contains(s.Process.Args, "--warm")}
	var sockDir string
	for _, m := range s.Mounts {
		if m.Destination == runsc.AgentSocketDir {
			sockDir = m.Source
		}
	}
	if _, err := os.Stat(filepath.Join(sockDir, "..", "bin", runsc.AgentBinary)); err != nil {
		return fmt.Errorf("agent binary: %w", err)
	}
	if a.nonce, err = agent.ReadNonceFile(filepath.Join(sockDir, runsc.AgentNonce)); err != nil {
		return err
	}
	// Bound through the dir's descriptor, as the node dials: the path may
	// be longer than a socket address.
	fd, err := unix.Open(sockDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("agent socket dir %q: %w", sockDir, err)
	}
	defer unix.Close(fd)
	if a.l, err = net.Listen("unix", "/proc/self/fd/"+strconv.Itoa(fd)+"/"+runsc.AgentSocket); err != nil {
		return err
	}
	a.l.(*net.UnixListener).SetUnlinkOnClose(false) // the real socket file outlives its guest
	c.agent = a
	go a.serve()
	return nil
}

// HoldClaims makes warm agents' claim calls wait before they answer,
// until release is called: each held claim sends its container id on
// held first (buffered for 16), so a test can look at the node while a
// claim's agent round trip runs.
func (k *Kernel) HoldClaims() (held <-chan string, release func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	hold, ch := make(chan struct{}), make(chan string, 16)
	k.claimHold, k.claimHeld = hold, ch
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			k.mu.Lock()
			k.claimHold, k.claimHeld = nil, nil
			k.mu.Unlock()
			close(hold)
		})
	}
}

func (a *fakeAgent) stop() { a.closed.Do(func() { a.l.Close() }) }

func (a *fakeAgent) serve() {
	for {
		c, err := a.l.Accept()
		if err != nil {
			return
		}
		go a.handle(c)
	}
}

func (a *fakeAgent) handle(c net.Conn) {
	defer c.Close()
	t, p, err := wire.ReadFrame(c, nil, wire.MaxPayload)
	if err != nil || t != wire.TRequest {
		return
	}
	var req wire.Request
	if err := wire.Decode(p, &req); err != nil {
		wire.WriteJSON(c, wire.TError, wire.Error{Code: wire.CodeInvalid, Message: err.Error()})
		return
	}
	a.k.mu.Lock()
	err = a.k.makeFails(KindExec, a.id)
	a.k.mu.Unlock()
	if err != nil {
		wire.WriteJSON(c, wire.TError, wire.Error{Code: wire.CodeInternal, Message: err.Error()})
		return
	}
	if err := a.call(c, req); err != nil {
		code := wire.CodeInternal
		switch {
		case errors.Is(err, fs.ErrNotExist):
			code = wire.CodeNotFound
		case errors.Is(err, fs.ErrPermission):
			code = wire.CodePermission
		case errors.Is(err, fs.ErrExist):
			code = wire.CodeExists
		}
		wire.WriteJSON(c, wire.TError, wire.Error{Code: code, Message: err.Error()})
	}
}

// claim is a warm agent's one claim (agent.Server's OpClaim): it starts
// no process here, but answers as the real one does: invalid on a cold
// agent or without a nonce or command, exists when claimed already, and
// the claim's nonce from then on.
func (a *fakeAgent) claim(c net.Conn, req wire.Request) error {
	fail := func(code, msg string) error {
		return wire.WriteJSON(c, wire.TError, wire.Error{Code: code, Message: msg})
	}
	if !a.warm {
		return fail(wire.CodeInvalid, "not a warm agent: its workload started at boot")
	}
	if req.Nonce == "" || len(req.Args) == 0 {
		return fail(wire.CodeInvalid, "claim without a nonce or a command")
	}
	a.mu.Lock()
	taken := a.claimed
	a.claimed = true
	if !taken {
		a.nonce = req.Nonce
	}
	a.mu.Unlock()
	if taken {
		return fail(wire.CodeExists, "this warm agent was claimed already")
	}
	a.k.mu.Lock()
	a.k.call("agent claim %s %q", a.id, req.Args)
	hold, held := a.k.claimHold, a.k.claimHeld
	a.k.mu.Unlock()
	if hold != nil {
		held <- a.id
		<-hold
	}
	return wire.WriteJSON(c, wire.TResult, wire.Ready{Nonce: req.Nonce})
}

// rel is a guest path relative to the root.
func rel(p string) string {
	r := strings.TrimPrefix(path.Clean("/"+p), "/")
	if r == "" {
		return "."
	}
	return r
}

func (a *fakeAgent) call(c net.Conn, req wire.Request) error {
	if req.Op == wire.OpReady {
		a.mu.Lock()
		nonce := a.nonce
		a.mu.Unlock()
		return wire.WriteJSON(c, wire.TResult, wire.Ready{Nonce: nonce})
	}
	if req.Op == wire.OpClaim {
		return a.claim(c, req)
	}
	if req.Op == wire.OpExec {
		return a.exec(c, req)
	}
	root, err := os.OpenRoot(a.root)
	if err != nil {
		return err
	}
	defer root.Close()
	p := rel(req.Path)
	switch req.Op {
	case wire.OpStat:
		fi, err := root.Lstat(p)
		if err != nil {
			return err
		}
		return wire.WriteJSON(c, wire.TResult, statOf(fi))
	case wire.OpList:
		f, err := root.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		ents, err := f.ReadDir(-1)
		if err != nil {
			return err
		}
		out := []wire.Stat{}
		for _, e := range ents {
			if fi, err := e.Info(); err == nil {
				out = append(out, statOf(fi))
			}
		}
		if err := wire.WriteJSON(c, wire.TData, out); err != nil {
			return err
		}
		return wire.WriteFrame(c, wire.TEnd, nil)
	case wire.OpMkdir:
		if req.Recursive {
			err = root.MkdirAll(p, fs.FileMode(req.Mode|0o700))
		} else {
			err = root.Mkdir(p, fs.FileMode(req.Mode|0o700))
		}
	case wire.OpRemove:
		if req.Recursive {
			err = root.RemoveAll(p)
		} else {
			err = root.Remove(p)
		}
	case wire.OpRename:
		err = root.Rename(p, rel(req.NewPath))
	case wire.OpRead:
		f, err := root.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		buf := make([]byte, wire.MaxPayload)
		var n int64
		for {
			m, rerr := f.Read(buf)
			if n += int64(m); req.Limit > 0 && n > req.Limit {
				return wire.WriteJSON(c, wire.TError, wire.Error{Code: wire.CodeTooLarge, Message: "past the limit"})
			}
			if m > 0 {
				if err := wire.WriteFrame(c, wire.TData, buf[:m]); err != nil {
					return err
				}
			}
			if rerr == io.EOF {
				return wire.WriteFrame(c, wire.TEnd, nil)
			}
			if rerr != nil {
				return rerr
			}
		}
	case wire.OpWrite:
		var data []byte
		for {
			t, p, err := wire.ReadFrame(c, nil, wire.MaxPayload)
			if err != nil {
				return err
			}
			if t == wire.TEnd {
				break
			}
			if data = append(data, p...); req.Limit > 0 && int64(len(data)) > req.Limit {
				return wire.WriteJSON(c, wire.TError, wire.Error{Code: wire.CodeTooLarge, Message: "past the limit"})
			}
		}
		if err := root.WriteFile(p, data, fs.FileMode(req.Mode|0o600)); err != nil {
			return err
		}
		return wire.WriteJSON(c, wire.TResult, wire.Written{Bytes: int64(len(data))})
	default:
		return fmt.Errorf("op %q: %w", req.Op, errors.ErrUnsupported)
	}
	if err != nil {
		return err
	}
	return wire.WriteJSON(c, wire.TResult, struct{}{})
}

func statOf(fi fs.FileInfo) wire.Stat {
	return wire.Stat{Name: fi.Name(), Size: fi.Size(), Mode: uint32(fi.Mode()), ModUnix: fi.ModTime().Unix()}
}

// exec runs the fake guest's command: stdin (until StdinClose) goes to
// cat, the output as one Stdout frame.
func (a *fakeAgent) exec(c net.Conn, req wire.Request) error {
	if len(req.Args) == 0 {
		return wire.WriteJSON(c, wire.TError, wire.Error{Code: wire.CodeInvalid, Message: "no args"})
	}
	var stdin []byte
	signal := 0 // the last signal the caller sent
	for done := false; !done; {
		t, p, err := wire.ReadFrame(c, nil, wire.MaxPayload)
		if err != nil {
			return err
		}
		switch t {
		case wire.TStdin:
			stdin = append(stdin, p...)
		case wire.TStdinClose:
			done = true
		case wire.TSignal:
			var sig wire.Signal
			if wire.Decode(p, &sig) == nil {
				signal = sig.Signal
			}
		}
	}
	switch path.Base(req.Args[0]) {
	case "sleep":
		return a.sleep(c, req.Args, signal)
	case "silent":
		// A hung command (or agent): nothing until the caller hangs up.
		for {
			if _, _, err := wire.ReadFrame(c, nil, wire.MaxPayload); err != nil {
				return nil
			}
		}
	case "timeout-ms":
		// The timeout the agent was asked to enforce.
		wire.WriteFrame(c, wire.TStdout, []byte(strconv.FormatInt(req.TimeoutMS, 10)))
		return wire.WriteJSON(c, wire.TExit, wire.Exit{})
	}
	out, errOut, code := fakeCommand(req.Args, stdin, req.TTY)
	for _, o := range []struct {
		t wire.Type
		b []byte
	}{{wire.TStdout, out}, {wire.TStderr, errOut}} {
		if len(o.b) > 0 {
			if err := wire.WriteFrame(c, o.t, o.b); err != nil {
				return err
			}
		}
	}
	return wire.WriteJSON(c, wire.TExit, wire.Exit{Code: code})
}

// sleep is busybox's "sleep N": it ends after N seconds, or killed by a
// signal the caller sends (signal: one sent already), or when the caller
// hangs up.
func (a *fakeAgent) sleep(c net.Conn, args []string, signal int) error {
	secs := 0
	if len(args) == 2 {
		secs, _ = strconv.Atoi(args[1])
	}
	sigs := make(chan int, 1)
	go func() {
		defer close(sigs)
		for {
			t, p, err := wire.ReadFrame(c, nil, wire.MaxPayload)
			if err != nil {
				return
			}
			var sig wire.Signal
			if t == wire.TSignal && wire.Decode(p, &sig) == nil {
				sigs <- sig.Signal
				return
			}
		}
	}()
	if signal == 0 {
		t := time.NewTimer(time.Duration(secs) * time.Second)
		defer t.Stop()
		select {
		case <-t.C:
			return wire.WriteJSON(c, wire.TExit, wire.Exit{})
		case sig, ok := <-sigs:
			if !ok {
				return nil // the caller hung up: nobody to answer
			}
			signal = sig
		}
	}
	return wire.WriteJSON(c, wire.TExit, wire.Exit{Code: -1, Signal: signal})
}

// shExit is the one "sh -c" script of exit codes the fake guest runs.
var shExit = regexp.MustCompile(`^exit ([0-9]{1,3})$`)

// fakeCommand is the fake guest's shell, busybox's behaviour for echo,
// true, false, cat (stdin to stdout), tty (tty: on a terminal), and "sh
// -c" with "exit N" or "echo out; echo err >&2"; anything else exits 127.
func fakeCommand(args []string, stdin []byte, tty bool) (stdout, stderr []byte, code int) {
	if path.Base(args[0]) == "sh" && len(args) == 3 && args[1] == "-c" {
		switch m := shExit.FindStringSubmatch(args[2]); {
		case m != nil:
			code, _ := strconv.Atoi(m[1])
			return nil, nil, code
		case args[2] == "echo out; echo err >&2":
			return []byte("out\n"), []byte("err\n"), 0
		}
	}
	switch path.Base(args[0]) {
	case "tty":
		if !tty {
			return []byte("not a tty\n"), nil, 1
		}
		return []byte("/dev/pts/0\n"), nil, 0
	case "echo":
		return []byte(strings.Join(args[1:], " ") + "\n"), nil, 0
	case "true":
		return nil, nil, 0
	case "false":
		return nil, nil, 1
	case "cat":
		return stdin, nil, 0
	}
	return nil, []byte(args[0] + ": not found\n"), 127
}
