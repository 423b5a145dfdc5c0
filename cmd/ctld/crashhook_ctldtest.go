//go:build ctldtest

package main

import (
	"log/slog"
	"os"
	"syscall"
	"time"
)

// crashHook serves the tests of journal recovery and of term end only, and
// is compiled only into test builds (-tags ctldtest: test/vm/vmrun builds
// them; the shipped binary has the no-op in crashhook.go): at the crash
// point named by CTLD_TEST_CRASH_AT it kills the process with SIGKILL; at
// the point named by CTLD_TEST_STALL_AT it sleeps CTLD_TEST_STALL_FOR (an
// effect that takes long while the term ends).
func crashHook(log *slog.Logger) func(string) {
	at, stallAt := os.Getenv("CTLD_TEST_CRASH_AT"), os.Getenv("CTLD_TEST_STALL_AT")
	if at == "" && stallAt == "" {
		return nil
	}
	stall, _ := time.ParseDuration(os.Getenv("CTLD_TEST_STALL_FOR"))
	log.Warn("test crash point armed", "point", at, "stall_point", stallAt, "stall", stall)
	return func(point string) {
		if point == at {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		if point == stallAt {
			log.Warn("test stall point reached", "point", point, "stall", stall)
			time.Sleep(stall)
		}
	}
}
