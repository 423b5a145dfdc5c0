package agent

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/ctld/ctld/internal/logging"
)

// Main is the ctl-agent command (cmd/ctl-agent; tests run it in a process
// of their own too): flags in args, settings in env, errors to stderr.
//
//	ctl-agent --socket PATH [--file-cap BYTES] [-- workload args...]
func Main(args, env []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("ctl-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "/.ctl/agent.sock", "the agent's Unix socket")
	fileCap := fs.Int64("file-cap", 1<<30, "the most bytes one file read or write moves")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := logging.New(stderr, slog.LevelInfo).With("component", "ctl-agent")
	// Before anything else: on success this does not return.
	if err := HideNonce(env); err != nil {
		fmt.Fprintln(stderr, "ctl-agent:", err)
		return 1
	}
	cfg, err := ConfigFromEnv(env)
	if err != nil {
		fmt.Fprintln(stderr, "ctl-agent:", err)
		return 2
	}
	if err := Hide(); err != nil {
		log.Warn("hide agent /proc files", "err", err)
	}
	reaper := NewReaper()
	// The workload starts before the socket exists: an answer to ready
	// then also says the workload was started, and one that cannot start
	// ends the guest before anything answers.
	var w *Workload
	if fs.NArg() > 0 {
		if w, err = StartWorkload(reaper, fs.Args(), cfg.Env, cfg.User); err != nil {
			fmt.Fprintln(stderr, "ctl-agent:", err)
			return 127
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, err := Listen(*socket)
	if err != nil {
		fmt.Fprintln(stderr, "ctl-agent:", err)
		if w != nil {
			cancel()
			w.Wait(ctx)
		}
		return 1
	}
	srv := &Server{Nonce: cfg.Nonce, User: cfg.User, FileCap: *fileCap, Reaper: reaper, Logger: log}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, l) }()
	if w == nil {
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
	return code
}
