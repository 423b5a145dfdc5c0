package guest

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/testutil"
)

// The agent's socket dir is the guest's to write: DialInDir dials only a
// socket there, never what a symlink placed there points at (a host
// socket dialled as root), nor a file or a directory.
func TestDialInDirRefusesWhatIsNotASocket(t *testing.T) {
	dir := t.TempDir()
	other := t.TempDir()
	// A host socket the guest would like ctld to dial.
	testutil.MuteListener(t, filepath.Join(other, "host.sock"))
	ctx := context.Background()
	if err := os.Symlink(filepath.Join(other, "host.sock"), filepath.Join(dir, "agent.sock")); err != nil {
		t.Fatal(err)
	}
	if c, err := DialInDir(ctx, dir, "agent.sock"); !errors.Is(err, ErrNotSocket) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("symlink to a host socket: %v; want ErrNotSocket", err)
	}
	os.Remove(filepath.Join(dir, "agent.sock"))
	os.WriteFile(filepath.Join(dir, "agent.sock"), nil, 0o600)
	if _, err := DialInDir(ctx, dir, "agent.sock"); !errors.Is(err, ErrNotSocket) {
		t.Fatalf("regular file: %v; want ErrNotSocket", err)
	}
	os.Remove(filepath.Join(dir, "agent.sock"))
	if _, err := DialInDir(ctx, dir, "agent.sock"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("absent: %v; want not exist", err)
	}
	// A real socket in the dir is dialled through its descriptor, also
	// when its path is longer than a socket path may be.
	long := filepath.Join(dir, strings.Repeat("d", 100))
	os.Mkdir(long, 0o700)
	// Listen through a short path to a long directory.
	short := filepath.Join(t.TempDir(), "l")
	os.Symlink(long, short)
	ln2, err := net.Listen("unix", filepath.Join(short, "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	c, err := DialInDir(ctx, long, "agent.sock")
	if err != nil {
		t.Fatalf("real socket: %v", err)
	}
	defer c.Close()
	pid, err := peerPID(c)
	if err != nil || pid != int32(os.Getpid()) {
		t.Fatalf("peer pid %d, %v; want %d", pid, err, os.Getpid())
	}
}

// The peer must be in the generation's lease cgroup or below it.
func TestProcPeersCheckTheLeaseCgroup(t *testing.T) {
	proc := t.TempDir()
	write := func(pid, text string) {
		os.MkdirAll(filepath.Join(proc, pid), 0o755)
		os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(text), 0o644)
	}
	write("10", "0::/ctld.slice/gen-a\n")
	write("11", "0::/ctld.slice/gen-a/sub\n")
	write("12", "0::/ctld.slice/gen-ab\n")
	write("13", "0::/system.slice/ctld@a.service\n")
	write("14", "12:memory:/ctld.slice/gen-a\n")
	p := ProcPeers{Proc: proc}
	for pid, ok := range map[int32]bool{10: true, 11: true, 12: false, 13: false, 14: false, 15: false, 0: false} {
		err := p.CheckPeer(pid, "/ctld.slice/gen-a")
		if (err == nil) != ok {
			t.Errorf("pid %d: %v; want ok=%v", pid, err, ok)
		}
	}
	if err := p.CheckPeer(10, ""); err == nil {
		t.Error("no lease cgroup: accepted")
	}
	// The real /proc: this process is not in a lease.
	if err := (ProcPeers{}).CheckPeer(int32(os.Getpid()), "/ctld.slice/gen-a"); err == nil {
		t.Error("the test process passed as a generation's peer")
	}
}
