// Package nbdtest serves an nbdsrv export to the tests of the packages
// built on it and runs the userspace NBD peers (nbdinfo, qemu-img, ...)
// against it: the peers that test/nbd/setup.sh installs.
package nbdtest

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/nbdsrv"
	"github.com/ctld/ctld/internal/testutil"
)

// Served is an export served on a Unix socket until the test ends.
type Served struct {
	URI  string // nbd+unix:///?socket=Sock
	Sock string
	// Stop cancels Serve and waits for it (the test's end does too).
	Stop func()
}

// Serve serves exp on a fresh Unix socket until the test ends; Serve's
// error fails the test.
func Serve(t testing.TB, exp nbdsrv.Export, opts nbdsrv.Options) *Served {
	t.Helper()
	srv, err := nbdsrv.New(exp, opts)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(testutil.SocketDir(t), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("Serve did not return 20s after its context ended")
		}
	}
	t.Cleanup(stop)
	return &Served{URI: "nbd+unix:///?socket=" + sock, Sock: sock, Stop: stop}
}

// NeedPeers fails (never skips) when a peer program the test drives is
// not installed: test/nbd/setup.sh installs them, and CI runs it first.
func NeedPeers(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			t.Fatalf("NBD peer %s not installed: run test/nbd/setup.sh as root (%v)", n, err)
		}
	}
}

// Peer runs a peer and returns its combined output; a non-zero exit fails
// the test.
func Peer(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := PeerErr(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// PeerErr runs a peer (at most 5 minutes) and returns its combined
// output and error.
func PeerErr(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}
