package guestlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Config is what the log writer process (Run) needs.
type Config struct {
	Dir string // the generation's log directory
	Max int64  // cap of the init log, and of each watched file
	// CapEvery is how often the watched files (runsc's log) are capped
	// while the guest runs (default 1 s).
	CapEvery time.Duration
}

// Run is the log writer: it copies in (the read end of the pipe that is the
// guest init's stdout and stderr) into the Ring Dir/init.log until every
// write end is closed, which happens when the guest's sandbox is gone, and
// meanwhile caps Dir/runsc.log. Read errors end it; write errors never do
// (see Ring), so the guest is never blocked or broken by a full log.
func Run(ctx context.Context, in io.Reader, cfg Config) error {
	if err := ValidMax(cfg.Max); err != nil {
		return err
	}
	every := cfg.CapEvery
	if every <= 0 {
		every = time.Second
	}
	runscLog := filepath.Join(cfg.Dir, RunscName)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				_ = Cap(runscLog, cfg.Max) // best effort; retried next tick
			}
		}
	}()
	ring := &Ring{Dir: cfg.Dir, Name: InitName, Max: cfg.Max}
	buf := make([]byte, 32<<10)
	var rerr error
	for {
		n, err := in.Read(buf)
		if n > 0 {
			ring.Write(buf[:n])
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				rerr = fmt.Errorf("read guest output: %w", err)
			}
			break
		}
	}
	close(stop)
	<-done
	_ = Cap(runscLog, cfg.Max)
	return errors.Join(rerr, ring.Close())
}

// Shim starts log writer processes.
type Shim struct {
	// Argv runs Run with the flags --dir and --max-bytes appended, e.g.
	// {"/usr/local/bin/ctld", "logshim"}.
	Argv []string
	Max  int64
	// Env is added to the writer's environment.
	Env []string
}

// Writer is a started log writer.
type Writer struct {
	// Pid of the writer process.
	Pid  int
	done chan struct{}
	err  error
}

// Wait waits until the writer exited (it has written everything it read),
// or ctx is done.
func (w *Writer) Wait(ctx context.Context) error {
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return fmt.Errorf("wait for log writer %d: %w", w.Pid, ctx.Err())
	}
}

// Start starts a writer of dir's init log in cgroup cgroupDir ("" = the
// caller's) and returns the write end of its pipe: give it to the guest as
// stdout and stderr, then close it. The writer runs in its own session,
// with no fd of ours but the pipe, so it outlives this process (a ctld
// failover); it exits once the last write end is closed. Placing it in the
// lease cgroup at clone (CLONE_INTO_CGROUP) charges its memory and the
// tmpfs pages of the log to the sandbox, and removing the lease kills it.
// The process is reaped by a goroutine of ours while we live.
func (s Shim) Start(dir, cgroupDir string) (*os.File, *Writer, error) {
	if len(s.Argv) == 0 {
		return nil, nil, errors.New("start log writer: no command")
	}
	if err := ValidMax(s.Max); err != nil {
		return nil, nil, fmt.Errorf("start log writer: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("start log writer: %w", err)
	}
	defer r.Close()
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		w.Close()
		return nil, nil, fmt.Errorf("start log writer: %w", err)
	}
	defer null.Close()
	args := append(append([]string(nil), s.Argv[1:]...), "--dir", dir, "--max-bytes", strconv.FormatInt(s.Max, 10))
	cmd := exec.Command(s.Argv[0], args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, null, null
	// Nothing of ctld's environment; one P is plenty for a pipe copy, and
	// fewer threads count against the lease's pids.max.
	cmd.Env = append([]string{"GOMAXPROCS=1"}, s.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if cgroupDir != "" {
		cg, err := unix.Open(cgroupDir, unix.O_DIRECTORY|unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			w.Close()
			return nil, nil, fmt.Errorf("start log writer: open cgroup %s: %w", cgroupDir, err)
		}
		defer unix.Close(cg)
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, cg
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, nil, fmt.Errorf("start log writer: %w", err)
	}
	wr := &Writer{Pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		wr.err = cmd.Wait()
		close(wr.done)
	}()
	return w, wr, nil
}
