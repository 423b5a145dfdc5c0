package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

// TestRuntimeSkipsCgroupReads checks that the agent's binary is built with
// the runtime settings that keep it from reading its cgroup at start and
// every second after (main.go's //go:debug lines): what the build records
// is what the runtime of this binary uses.
func TestRuntimeSkipsCgroupReads(t *testing.T) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("no build info")
	}
	var godebug string
	for _, s := range bi.Settings {
		if s.Key == "DefaultGODEBUG" {
			godebug = s.Value
		}
	}
	for _, want := range []string{"containermaxprocs=0", "updatemaxprocs=0"} {
		if !strings.Contains(","+godebug+",", ","+want+",") {
			t.Errorf("DefaultGODEBUG %q lacks %s", godebug, want)
		}
	}
}
