package agent

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/logging"
)

// Main is the ctl-agent command (cmd/ctl-agent; tests run it in a process
// of their own too): flags in args, settings in env, errors to stderr.
//
//	ctl-agent --socket PATH --nonce-file PATH [--file-cap BYTES] [-- workload args...]
//	ctl-agent --warm --socket PATH --nonce-file PATH [--file-cap BYTES]
//
// --warm boots a warm pool member's agent (claim.go): no workload until
// one OpClaim names it.
func Main(args, env []string, stderr io.Writer) int {
	boot := bootTimes{main: time.Now()}
	if len(args) > 0 && args[0] == ExecHelperArg {
		return RunExecHelper(args[1:], stderr)
	}
	fs := flag.NewFlagSet("ctl-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "/.ctl/agent.sock", "the agent's Unix socket")
	nonceFile := fs.String("nonce-file", "", "the file the readiness nonce is read from, then removed (required)")
	fileCap := fs.Int64("file-cap", 1<<30, "the most bytes one file read or write moves")
	warm := fs.Bool("warm", false, "boot with no workload; the first claim call starts one")
	hostCap := fs.Bool("hostname-cap", false, "a warm agent holding CAP_SYS_ADMIN to set the claim's hostname; dropped before the workload starts")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *hostCap && !*warm {
		fmt.Fprintln(stderr, "ctl-agent: --hostname-cap is for a warm agent")
		return 2
	}
	if *warm && fs.NArg() > 0 {
		fmt.Fprintln(stderr, "ctl-agent: --warm takes no workload: a claim call names it")
		return 2
	}
	log := logging.New(stderr, slog.LevelInfo).With("component", "ctl-agent")
	cfg, err := ConfigFromEnv(env)
	if err != nil {
		fmt.Fprintln(stderr, "ctl-agent:", err)
		return 2
	}
	if *nonceFile == "" {
		fmt.Fprintln(stderr, "ctl-agent: --nonce-file is required")
		return 2
	}
	// Before anything else runs in the guest.
	if cfg.Nonce, err = ReadNonceFile(*nonceFile); err != nil {
		fmt.Fprintln(stderr, "ctl-agent:", err)
		return 2
	}
	if err := Hide(); err != nil {
		log.Warn("hide agent /proc files", "err", err)
	}
	reaper := NewReaper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The socket comes first and the workload starts while it is served:
	// the host's first `ready` overlaps the workload's fork+exec. `ready`
	// is answered only once that start succeeded, and fails with its
	// error otherwise, so an answer still says the workload started.
	l, err := Listen(*socket)
	if err != nil {
		fmt.Fprintln(stderr, "ctl-agent:", err)
		return 1
	}
	boot.listening = time.Now()
	start := newStartGate()
	srv := &Server{Nonce: cfg.Nonce, User: cfg.User, FileCap: *fileCap, Reaper: reaper, Logger: log, Started: start.wait}
	var claimed chan *Workload
	var claimReport wire.ClaimReport // written before the claim is sent on claimed
	if *warm {
		claimed = make(chan *Workload, 1)
		srv.Hostnames = *hostCap
		helper, err := startExecHelper(reaper, *hostCap)
		if err != nil {
			log.Warn("no pre-forked workload process: the claim forks one", "err", err)
		}
		srv.Claim = func(_ context.Context, c Claim) error {
			t0 := time.Now()
			if *hostCap {
				if err := SetHostnameAndDrop(c.Hostname); err != nil {
					return err
				}
			}
			t1 := time.Now()
			var w *Workload
			var err error
			if helper != nil {
				w, err = helper.start(c)
			} else {
				w, err = StartWorkloadIn(reaper, c.Args, c.Env, c.Cwd, c.User)
			}
			if err != nil {
				return err
			}
			claimReport = wire.ClaimReport{HostnameMS: ms(t1.Sub(t0)), StartMS: ms(time.Since(t1)), Preforked: helper != nil}
			claimed <- w // once: the server refuses a second claim
			return nil
		}
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, l) }()
	if *warm {
		start.done(nil)
		reaper.Run()
		// One channel for the agent's life: the signals it forwards are
		// caught from boot, so none is lost in a hand-over at the claim.
		sig := make(chan os.Signal, 8)
		signal.Notify(sig, forwarded...)
		for {
			select {
			case s := <-sig:
				if s == syscall.SIGTERM || s == syscall.SIGINT {
					return 0
				}
				// Nothing to forward to before the claim.
			case err := <-served:
				fmt.Fprintln(stderr, "ctl-agent:", err)
				return 1
			case w := <-claimed:
				w.forwardFrom(sig)
				go writeReport(filepath.Dir(*socket), wire.ClaimReportName, claimReport)
				return waitWorkload(ctx, log, w, served, *socket, stderr)
			}
		}
	}
	if fs.NArg() == 0 {
		start.done(nil)
		reaper.Run()
		// No workload: serve until told to stop.
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		select {
		case <-sig:
			return 0
		case err := <-served:
			fmt.Fprintln(stderr, "ctl-agent:", err)
			return 1
		}
	}
	w, err := StartWorkload(reaper, fs.Args(), cfg.Env, cfg.User)
	boot.started = time.Now()
	start.done(err)
	// The ready call waiting for the start answers first; the signal
	// setup after it is not on the readiness path (see Reaper.Run).
	runtime.Gosched()
	reaper.Run()
	if err == nil {
		go writeBootReport(filepath.Dir(*socket), boot)
	}
	if err != nil {
		fmt.Fprintln(stderr, "ctl-agent:", err)
		// A ready call already waiting gets the error; then the guest
		// ends (its init exits), which the host's wait also notices.
		srv.Drain(readyDrain)
		l.Close()
		return 127
	}
	return waitWorkload(ctx, log, w, served, *socket, stderr)
}

// waitWorkload serves until the workload ends, then leaves its exit
// report beside the socket and returns its code.
func waitWorkload(ctx context.Context, log *slog.Logger, w *Workload, served <-chan error, socket string, stderr io.Writer) int {
	go func() {
		// Serve ends early only when its listener is gone: say so, the
		// guest is then unreachable through its agent (the log shows it).
		if err := <-served; err != nil && ctx.Err() == nil {
			log.Error("no longer serving: the guest cannot be reached through its agent", "err", err)
		}
	}()
	code, err := w.Wait(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "ctl-agent:", err)
	}
	// The host's exit watch reads the status from here once the guest
	// is gone (a failed write leaves it to see a crash instead).
	if err := WriteExitReport(filepath.Dir(socket), code); err != nil {
		fmt.Fprintln(stderr, "ctl-agent:", err)
	}
	return code
}

// readyDrain bounds how long an agent whose workload could not start
// waits to give the ready calls already waiting their answer.
const readyDrain = time.Second

// startGate is the workload's start, decided once: ready calls wait on it.
type startGate struct {
	ch  chan struct{}
	err error
}

func newStartGate() *startGate { return &startGate{ch: make(chan struct{})} }

// done decides the start (once).
func (g *startGate) done(err error) { g.err = err; close(g.ch) }

// wait returns the start's error once it is decided, or ctx's.
func (g *startGate) wait(ctx context.Context) error {
	select {
	case <-g.ch:
		return g.err
	case <-ctx.Done():
		return ctx.Err()
	}
}
