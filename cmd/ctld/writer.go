package main

import (
	"errors"
	"log/slog"
	"os/signal"
	"syscall"

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
			log := logging.New(cmd.ErrOrStderr(), slog.LevelInfo).With("component", "writer")
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

// asExitCode returns the exit code an error asks for, if any.
func asExitCode(err error) (int, bool) {
	var ec exitCodeError
	if errors.As(err, &ec) {
		return ec.code, true
	}
	return 0, false
}
