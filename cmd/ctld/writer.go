package main

import (
	"errors"
	"io"
	"log/slog"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ctld/ctld/internal/guestlog"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/writer"
	"github.com/spf13/cobra"
)

// exitCodeError ends ctld with a specific exit code (the writer's
// refusals, which its supervisor tells apart).
type exitCodeError struct {
	err  error
	code int
}

func (e exitCodeError) Error() string { return e.err.Error() }
func (e exitCodeError) Unwrap() error { return e.err }

// writerCmd is the NBD writer of one block-mode generation, started by the
// primary (writer.Supervisor) in its own session and cgroup.
func writerCmd() *cobra.Command {
	var spec string
	c := &cobra.Command{
		Use:    "writer --spec FILE",
		Short:  "serve a block-mode generation's NBD device (started by the primary)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if spec == "" {
				return usagef("--spec is required")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			log := writerLogger(cmd.ErrOrStderr(), spec, time.Now)
			err := writer.RunFile(ctx, spec, log)
			if err != nil {
				log.Error("writer failed", "err", err)
			}
			if code := writer.ExitCode(err); code > exitError {
				return exitCodeError{err, code}
			}
			return err
		},
	}
	c.Flags().StringVar(&spec, "spec", "", "the writer's spec (JSON, written by the primary)")
	return c
}

// writerLogger is the writer's logger: text lines on stderr, which is its
// log file in its dir beside the spec, bounded (writer.LogMax) and rate
// limited per kind of line (writer.LogBurst per writer.LogEvery).
func writerLogger(stderr io.Writer, spec string, now func() time.Time) *slog.Logger {
	out := &guestlog.CappedFile{W: stderr, Path: filepath.Join(filepath.Dir(spec), writer.LogName), Max: writer.LogMax}
	h := logging.Limit(logging.New(out, slog.LevelInfo).Handler(), writer.LogBurst, writer.LogEvery, now)
	return slog.New(h).With("component", "writer")
}

// asExitCode returns the exit code an error asks for, if any.
func asExitCode(err error) (int, bool) {
	var ec exitCodeError
	if errors.As(err, &ec) {
		return ec.code, true
	}
	return 0, false
}
