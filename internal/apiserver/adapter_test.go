package apiserver_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/apiserver"
	"github.com/ctld/ctld/internal/apiserver/servicetest"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node"
	"github.com/ctld/ctld/internal/node/fakekernel"
	"github.com/ctld/ctld/internal/nodetest"
	"github.com/ctld/ctld/internal/proof"
)

// fakeNode is a primary node over the fake kernel (internal/node's unit
// tests run the same kernel), reconciled and ready to serve; it ends with
// the test.
func fakeNode(t *testing.T) (*node.Node, *fakekernel.Kernel) {
	t.Helper()
	return fakeNodeWith(t, func(*node.Deps) {})
}

// fakeNodeWith is fakeNode with its deps changed by with first.
func fakeNodeWith(t *testing.T, with func(*node.Deps)) (*node.Node, *fakekernel.Kernel) {
	t.Helper()
	dir := t.TempDir()
	if d, err := os.MkdirTemp("/dev/shm", "ctld-adapter-test-"); err == nil {
		// The journal fsyncs every transaction: tmpfs makes that free.
		dir = d
		t.Cleanup(func() { os.RemoveAll(d) })
	}
	k, err := fakekernel.New(filepath.Join(dir, "kernel"))
	if err != nil {
		t.Fatal(err)
	}
	ident, err := proof.LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	j, err := journal.Open(filepath.Join(dir, "journal.db"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.TakeOver(1); err != nil {
		t.Fatal(err)
	}
	term, end := context.WithCancel(context.Background())
	k.RestartDNSProxy()
	d := nodetest.Deps(k)
	d.Journal, d.Answers, d.Identity, d.Epoch, d.Term = j, apiserver.Answers{}, ident, 1, term
	d.Total = node.Capacity{CPUMillis: 4000, MemoryBytes: 8 << 30, PIDs: 10000, DiskBytes: 10 << 30}
	d.Logger = slog.New(slog.DiscardHandler)
	with(&d)
	n := node.New(node.Config{
		Slot: "a", StateDir: dir, RunDir: k.RunDir(), TemplatesDir: k.TemplatesDir(),
		DefaultDiskBytes: 16 << 20, AgentBinary: k.AgentBinary(),
		Block: node.BlockConfig{WritersDir: k.WritersDir(), NodeKeyID: "node", CheckEvery: 10 * time.Millisecond},
	}, d)
	t.Cleanup(func() {
		end()
		n.Close()
		j.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Reconcile(ctx); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return n, k
}

// TestServiceContract: the node over the fake kernel, served through the
// adapter, keeps the contract the manager's fake node is held to as well
// (servicetest), the guest agent's calls included.
func TestServiceContract(t *testing.T) {
	servicetest.Run(t, func(t *testing.T) apiserver.Service {
		n, _ := fakeNode(t)
		return apiserver.Adapter{N: n}
	}, servicetest.LiveNetwork, servicetest.GuestAgent)
}
