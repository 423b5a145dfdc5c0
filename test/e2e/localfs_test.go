package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStateDirOnNetworkFSRefused: ctld refuses to run the election and the
// journal on 9p, where flock is not a local kernel lock, and says so.
func TestStateDirOnNetworkFSRefused(t *testing.T) {
	e := newEnv(t)
	share := ""
	if b, err := os.ReadFile("/proc/self/mounts"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 3 && f[2] == "9p" && strings.HasPrefix(f[3], "rw") {
				share = f[1]
			}
		}
	}
	if share == "" {
		t.Fatal("no writable 9p mount in the test VM (the harness's results share)")
	}
	dir, err := os.MkdirTemp(share, "e2e-9p-state-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e.stateDir = filepath.Join(dir, "state")
	e.start("a")
	e.waitExit("a", 30*time.Second)
	logs, _ := filepath.Glob(filepath.Join(dir, "ctld-a-*.log"))
	var log []byte
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		log = append(log, b...)
	}
	if !strings.Contains(string(log), "is on 9p") || !strings.Contains(string(log), "not a local kernel lock") {
		t.Fatalf("ctld on a 9p state dir did not refuse with a clear error; log:\n%s", log)
	}
	if _, err := os.Stat(filepath.Join(e.stateDir, "ha", "epoch")); !os.IsNotExist(err) {
		t.Fatalf("epoch written on 9p: %v", err)
	}
	t.Logf("refused: %s", lastLine(string(log)))
}

func lastLine(s string) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	return ls[len(ls)-1]
}
