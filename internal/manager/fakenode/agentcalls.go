package fakenode

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// The guest agent's calls, in memory. A session knows a few commands with
// busybox's behaviour: cat, echo, true, false, tty, "sh -c 'exit N'",
// sleep N (ends early on a signal: killed by it), and an interactive "sh"
// that answers "stty size" lines and ends on "exit"; and Exec's "id" and
// "fail N MSG".

var shExit = regexp.MustCompile(`^exit ([0-9]+)$`)

// Session implements apiserver.Service.
func (n *Node) Session(ctx context.Context, id string, req api.ExecRequest, s api.Streams) (api.ExecExit, error) {
	if err := n.ready(id); err != nil {
		return api.ExecExit{}, err
	}
	n.mu.Lock()
	n.Sessions = append(n.Sessions, req)
	n.mu.Unlock()
	stdout, stderr, stdin := orDiscard(s.Stdout), orDiscard(s.Stderr), s.Stdin
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	term := &termState{size: api.TermSize{Rows: req.Rows, Cols: req.Cols}}
	if req.TTY && term.size.Rows == 0 {
		term.size = api.TermSize{Rows: 24, Cols: 80}
	}
	if req.TTY {
		// A terminal has one output: stderr goes to it too.
		stderr = stdout
	}
	// The command runs in its own goroutine; the session ends with it, on
	// a signal (killed by it) or when ctx ends (the process group killed).
	ended := make(chan api.ExecExit, 1)
	go func() {
		if x, ok := n.script(id, req, stdin, stdout, stderr); ok {
			ended <- x
			return
		}
		ended <- run(req, term, stdin, stdout, stderr)
	}()
	for {
		select {
		case x := <-ended:
			return x, nil
		case <-ctx.Done():
			return api.ExecExit{ExitCode: -1}, errdefs.Errorf(errdefs.CodeUnavailable, "session of %s ended: %v", id, context.Cause(ctx))
		case sig := <-s.Signal:
			n.mu.Lock()
			n.Signals = append(n.Signals, sig)
			n.mu.Unlock()
			return api.ExecExit{ExitCode: -1, Signal: sig}, nil
		case sz := <-s.Resize:
			term.set(sz)
		}
	}
}

type termState struct {
	mu   sync.Mutex
	size api.TermSize
}

func (t *termState) set(s api.TermSize) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.size = s
}

func (t *termState) get() api.TermSize {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.size
}

func run(req api.ExecRequest, term *termState, stdin io.Reader, stdout, stderr io.Writer) api.ExecExit {
	// /bin/sh is sh: the fake's commands are found by name.
	args := append([]string{path.Base(req.Args[0])}, req.Args[1:]...)
	switch {
	case args[0] == "cat":
		io.Copy(stdout, stdin)
	case args[0] == "echo":
		fmt.Fprintln(stdout, joinArgs(args[1:]))
	case args[0] == "id":
		if req.User == nil {
			fmt.Fprintln(stdout, "default")
		} else {
			fmt.Fprintf(stdout, "uid=%d gid=%d\n", req.User.UID, req.User.GID)
		}
	case args[0] == "fail" && len(args) >= 2:
		code, _ := strconv.Atoi(args[1])
		fmt.Fprintln(stderr, joinArgs(args[2:]))
		return api.ExecExit{ExitCode: code}
	case args[0] == "true":
	case args[0] == "false":
		return api.ExecExit{ExitCode: 1}
	case args[0] == "tty":
		if !req.TTY {
			fmt.Fprintln(stdout, "not a tty")
			return api.ExecExit{ExitCode: 1}
		}
		fmt.Fprintln(stdout, "/dev/pts/0")
	case args[0] == "sleep" && len(args) == 2:
		d, _ := strconv.Atoi(args[1])
		time.Sleep(time.Duration(d) * time.Second)
	case args[0] == "sh" && len(args) == 3 && args[1] == "-c" && shExit.MatchString(args[2]):
		code, _ := strconv.Atoi(shExit.FindStringSubmatch(args[2])[1])
		return api.ExecExit{ExitCode: code}
	case args[0] == "sh" && len(args) == 3 && args[1] == "-c" && args[2] == "echo out; echo err >&2":
		fmt.Fprintln(stdout, "out")
		fmt.Fprintln(stderr, "err")
	case args[0] == "sh" && len(args) == 1:
		sc := bufio.NewScanner(stdin)
		for fmt.Fprint(stdout, "$ "); sc.Scan(); fmt.Fprint(stdout, "$ ") {
			switch line := strings.TrimSpace(sc.Text()); line {
			case "stty size":
				sz := term.get()
				fmt.Fprintf(stdout, "%d %d\n", sz.Rows, sz.Cols)
			case "exit":
				return api.ExecExit{}
			default:
				fmt.Fprintf(stderr, "sh: %s: not found\n", line)
			}
		}
	default:
		fmt.Fprintf(stderr, "%s: not found\n", args[0])
		return api.ExecExit{ExitCode: 127}
	}
	return api.ExecExit{}
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// ExecViaRunsc implements apiserver.Service: Exec, counted in RunscExecs.
func (n *Node) ExecViaRunsc(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (int, error) {
	n.mu.Lock()
	n.RunscExecs++
	n.mu.Unlock()
	return n.Exec(ctx, id, req, stdout, stderr)
}

// fsKey is the key of a guest path in the fake's file maps.
func fsKey(id, p string) string { return id + ":" + path.Clean(p) }

// lookup reports what is at p. Call with n.mu held.
func (n *Node) lookup(id, p string) (api.FileInfo, bool) {
	p = path.Clean(p)
	fi := api.FileInfo{Name: path.Base(p), ModUnix: 1764579600}
	if p == "/" {
		fi.Mode = uint32(fs.ModeDir | 0o755)
		return fi, true
	}
	if b, ok := n.files[fsKey(id, p)]; ok {
		fi.Size, fi.Mode = int64(len(b)), n.modes[fsKey(id, p)]
		if fi.Mode == 0 {
			fi.Mode = 0o644
		}
		return fi, true
	}
	if m, ok := n.dirs[fsKey(id, p)]; ok {
		fi.Mode = uint32(fs.ModeDir) | m
		return fi, true
	}
	return fi, false
}

func notFound(id, p string) error {
	return errdefs.Errorf(errdefs.CodeNotFound, "%s in sandbox %s: no such file or directory", p, id)
}

// StatFile implements apiserver.Service.
func (n *Node) StatFile(ctx context.Context, id, p string, user *api.User) (api.FileInfo, error) {
	if err := n.ready(id); err != nil {
		return api.FileInfo{}, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	fi, ok := n.lookup(id, p)
	if !ok {
		return fi, notFound(id, p)
	}
	return fi, nil
}

// ListDir implements apiserver.Service: entries sorted by name.
func (n *Node) ListDir(ctx context.Context, id, p string, user *api.User) ([]api.FileInfo, error) {
	if err := n.ready(id); err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	fi, ok := n.lookup(id, p)
	if !ok {
		return nil, notFound(id, p)
	}
	if fs.FileMode(fi.Mode)&fs.ModeDir == 0 {
		return nil, errdefs.Errorf(errdefs.CodeInvalidArgument, "list %s: not a directory", p)
	}
	var out []api.FileInfo
	for _, m := range []map[string][]byte{n.files, dirKeys(n.dirs)} {
		for k := range m {
			kid, kp, _ := strings.Cut(k, ":")
			if kid == id && path.Dir(kp) == path.Clean(p) && kp != "/" {
				e, _ := n.lookup(id, kp)
				out = append(out, e)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func dirKeys(m map[string]uint32) map[string][]byte {
	out := make(map[string][]byte, len(m))
	for k := range m {
		out[k] = nil
	}
	return out
}

// MakeDir implements apiserver.Service.
func (n *Node) MakeDir(ctx context.Context, id, p string, mode uint32, parents bool, user *api.User) error {
	if err := n.ready(id); err != nil {
		return err
	}
	if mode == 0 {
		mode = 0o755
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	p = path.Clean(p)
	if fi, ok := n.lookup(id, p); ok {
		if parents && fs.FileMode(fi.Mode).IsDir() {
			return nil
		}
		return errdefs.Errorf(errdefs.CodeConflict, "mkdir %s: file exists", p)
	}
	var missing []string
	for d := p; d != "/"; d = path.Dir(d) {
		fi, ok := n.lookup(id, d)
		if ok && !fs.FileMode(fi.Mode).IsDir() {
			return errdefs.Errorf(errdefs.CodeInvalidArgument, "mkdir %s: %s is not a directory", p, d)
		}
		if ok {
			break
		}
		missing = append(missing, d)
	}
	if len(missing) > 1 && !parents {
		return notFound(id, path.Dir(p))
	}
	for _, d := range missing {
		n.dirs[fsKey(id, d)] = mode
	}
	return nil
}

// RemoveFile implements apiserver.Service.
func (n *Node) RemoveFile(ctx context.Context, id, p string, recursive bool, user *api.User) error {
	if err := n.ready(id); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	p = path.Clean(p)
	if _, ok := n.lookup(id, p); !ok {
		return notFound(id, p)
	}
	prefix := fsKey(id, p) + "/"
	for _, m := range []map[string][]byte{n.files, dirKeys(n.dirs)} {
		for k := range m {
			if strings.HasPrefix(k, prefix) && !recursive {
				return errdefs.Errorf(errdefs.CodeConflict, "remove %s: directory not empty", p)
			}
		}
	}
	for k := range n.files {
		if k == fsKey(id, p) || strings.HasPrefix(k, prefix) {
			delete(n.files, k)
			delete(n.modes, k)
		}
	}
	for k := range n.dirs {
		if k == fsKey(id, p) || strings.HasPrefix(k, prefix) {
			delete(n.dirs, k)
		}
	}
	return nil
}

// RenameFile implements apiserver.Service (files only, as the fake needs).
func (n *Node) RenameFile(ctx context.Context, id, from, to string, user *api.User) error {
	if err := n.ready(id); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	b, ok := n.files[fsKey(id, from)]
	if !ok {
		return notFound(id, from)
	}
	if fi, ok := n.lookup(id, path.Dir(to)); !ok || !fs.FileMode(fi.Mode).IsDir() {
		return notFound(id, path.Dir(to))
	}
	n.files[fsKey(id, to)], n.modes[fsKey(id, to)] = b, n.modes[fsKey(id, from)]
	delete(n.files, fsKey(id, from))
	delete(n.modes, fsKey(id, from))
	return nil
}

// ReadFileTo implements apiserver.Service.
func (n *Node) ReadFileTo(ctx context.Context, id, p string, user *api.User, limit int64, w io.Writer) (int64, error) {
	if err := n.ready(id); err != nil {
		return 0, err
	}
	n.mu.Lock()
	b, ok := n.files[fsKey(id, p)]
	_, isDir := n.dirs[fsKey(id, p)]
	n.mu.Unlock()
	switch {
	case isDir:
		return 0, errdefs.Errorf(errdefs.CodeInvalidArgument, "read %s: not a regular file", p)
	case !ok:
		return 0, notFound(id, p)
	case int64(len(b)) > limit:
		return 0, errdefs.Errorf(errdefs.CodeInvalidArgument, "read %s: %d bytes, over the limit of %d", p, len(b), limit)
	}
	nw, err := w.Write(b)
	return int64(nw), err
}

// WriteFileFrom implements apiserver.Service: the file changes only once
// all of r arrived within limit.
func (n *Node) WriteFileFrom(ctx context.Context, id, p string, user *api.User, mode uint32, limit int64, r io.Reader) (int64, error) {
	if err := n.ready(id); err != nil {
		return 0, err
	}
	var buf bytes.Buffer
	got, err := io.Copy(&buf, io.LimitReader(r, limit+1))
	if err != nil {
		return 0, fmt.Errorf("write %s: read data: %w", p, err)
	}
	if got > limit {
		return 0, errdefs.Errorf(errdefs.CodeInvalidArgument, "write %s: over the limit of %d bytes", p, limit)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if fi, ok := n.lookup(id, path.Dir(p)); !ok || !fs.FileMode(fi.Mode).IsDir() {
		return 0, notFound(id, path.Dir(p))
	}
	if mode == 0 {
		mode = 0o644
	}
	n.files[fsKey(id, p)], n.modes[fsKey(id, p)] = buf.Bytes(), mode
	return got, nil
}
