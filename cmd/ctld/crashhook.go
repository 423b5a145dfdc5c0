//go:build !ctldtest

package main

import "log/slog"

// crashHook is nil in the shipped binary: the crash and stall points that
// tests arm through the environment exist only in a build with
// -tags ctldtest (crashhook_ctldtest.go), so no environment variable can
// make a production ctld kill itself (internal/layering checks it).
func crashHook(*slog.Logger) func(string) { return nil }
