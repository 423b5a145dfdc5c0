package nodechannel_test

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager/fakenode"
	"github.com/ctld/ctld/internal/nodechannel"
	"github.com/ctld/ctld/internal/nodechannel/channeltest"
)

// serve runs the channel of node nodeID (certificate from ca) in front of
// a fake ctld and returns its address.
func serve(t *testing.T, ca *channeltest.CA, nodeID string, n *fakenode.Node) string {
	t.Helper()
	pool, cert, err := nodechannel.Load(ca.Issue(t, nodeID, true))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	p := &nodechannel.Proxy{Socket: fakenode.Serve(t, n)}
	go func() { done <- nodechannel.Serve(ctx, ln, p.Handler(), nodechannel.ServerTLS(pool, cert), nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String()
}

func clientOf(t *testing.T, ca *channeltest.CA, name, nodeID, addr string) *api.Client {
	t.Helper()
	pool, cert, err := nodechannel.Load(ca.Issue(t, name, false))
	if err != nil {
		t.Fatal(err)
	}
	dial := nodechannel.Dialer(nodechannel.ClientTLS(pool, cert))
	return &api.Client{Dial: func(ctx context.Context) (net.Conn, error) { return dial(ctx, nodeID, addr) }}
}

// TestChannelPassesOnlyStreamsToAuthenticatedManagers: a manager with a
// certificate of the cluster CA reaches a ready sandbox's exec and files
// through the node's channel; a peer with another CA's certificate, or
// none, is refused in the handshake, a manager that expects another node
// refuses this one's certificate, and claims, releases and the node's
// own calls are refused by the channel without reaching ctld.
func TestChannelPassesOnlyStreamsToAuthenticatedManagers(t *testing.T) {
	ctx := context.Background()
	ca := channeltest.NewCA(t, "cluster")
	n := fakenode.New("node-a")
	if _, err := n.Claim(ctx, "sb-1", api.ClaimRequest{OperationID: "op-claim-1", Generation: 1,
		RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"}, Resources: api.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 32}}); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, ca, "node-a", n)

	c := clientOf(t, ca, "manager", "node-a", addr)
	res, err := c.Exec(ctx, "sb-1", api.ExecRequest{Args: []string{"echo", "through", "the", "channel"}})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "through the channel\n" {
		t.Fatalf("exec through the channel: %+v, %v", res, err)
	}
	if err := c.WriteFile(ctx, "sb-1", "/tmp/f", []byte("data")); err != nil {
		t.Fatal(err)
	}
	if b, err := c.ReadFile(ctx, "sb-1", "/tmp/f"); err != nil || string(b) != "data" {
		t.Fatalf("read back: %q, %v", b, err)
	}
	if sb, err := c.Get(ctx, "sb-1"); err != nil || sb.State != api.StateReady {
		t.Fatalf("get: %+v, %v", sb, err)
	}

	// Not passed: the node process's own work and the node's calls.
	n.Lock()
	claimsBefore := len(n.ClaimOps)
	n.Unlock()
	if _, err := c.Claim(ctx, "sb-2", api.ClaimRequest{OperationID: "op-claim-2", Generation: 1, RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"},
		Resources: api.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 32}}); errdefs.CodeOf(err) != errdefs.CodeNotFound || !strings.Contains(err.Error(), "does not pass") {
		t.Fatalf("claim through the channel: %v, want not_found: the node channel does not pass", err)
	}
	if _, err := c.Release(ctx, "sb-1", api.ReleaseRequest{OperationID: "op-rel-1", Generation: 1}); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("release through the channel: %v, want not_found", err)
	}
	if _, err := c.Node(ctx); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("GET /v1/node through the channel: %v, want not_found", err)
	}
	n.Lock()
	claimsAfter, releases := len(n.ClaimOps), len(n.ReleaseOps)
	n.Unlock()
	if claimsAfter != claimsBefore || releases != 0 {
		t.Fatalf("ctld got %d claims and %d releases through the channel", claimsAfter-claimsBefore, releases)
	}
	if sb, _ := n.Get(ctx, "sb-1"); sb.State != api.StateReady {
		t.Fatalf("sb-1 is %s after the refused release", sb.State)
	}

	// Hostile peers.
	rogue := channeltest.NewCA(t, "rogue")
	if _, err := clientOf(t, rogue, "intruder", "node-a", addr).Get(ctx, "sb-1"); err == nil {
		t.Fatal("a client certificate of another CA was served")
	}
	pool, _, err := nodechannel.Load(ca.Issue(t, "nocert", false))
	if err != nil {
		t.Fatal(err)
	}
	conf := nodechannel.ClientTLS(pool, tls.Certificate{})
	conf.Certificates = nil
	dial := nodechannel.Dialer(conf)
	bare := &api.Client{Dial: func(ctx context.Context) (net.Conn, error) { return dial(ctx, "node-a", addr) }}
	if _, err := bare.Get(ctx, "sb-1"); err == nil {
		t.Fatal("a peer without a client certificate was served")
	}
	if _, err := clientOf(t, ca, "manager", "node-b", addr).Get(ctx, "sb-1"); err == nil || !strings.Contains(err.Error(), "node-b") {
		t.Fatalf("a manager dialling node-b accepted node-a's certificate: %v", err)
	}
}

// TestChannelRefusesANodesCertificate: the cluster CA issues the nodes'
// certificates too; a node's certificate that the CA also let
// authenticate clients (clientAuth) must not reach another node's
// sandboxes: the channel wants the manager identity (ManagerURI).
func TestChannelRefusesANodesCertificate(t *testing.T) {
	ctx := context.Background()
	ca := channeltest.NewCA(t, "cluster")
	n := fakenode.New("node-a")
	if _, err := n.Claim(ctx, "sb-1", api.ClaimRequest{OperationID: "op-claim-1", Generation: 1,
		RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"}, Resources: api.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 32}}); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, ca, "node-a", n)
	pool, cert, err := nodechannel.Load(ca.IssueNodeWithClientAuth(t, "node-b"))
	if err != nil {
		t.Fatal(err)
	}
	dial := nodechannel.Dialer(nodechannel.ClientTLS(pool, cert))
	nodeB := &api.Client{Dial: func(ctx context.Context) (net.Conn, error) { return dial(ctx, "node-a", addr) }}
	if _, err := nodeB.Exec(ctx, "sb-1", api.ExecRequest{Args: []string{"echo", "owned"}}); err == nil {
		t.Fatal("node-b's certificate (with clientAuth) ran an exec in node-a's sandbox")
	}
	if _, err := nodeB.Get(ctx, "sb-1"); err == nil {
		t.Fatal("node-b's certificate (with clientAuth) read node-a's sandbox")
	}
	// The manager's certificate still passes.
	if sb, err := clientOf(t, ca, "manager", "node-a", addr).Get(ctx, "sb-1"); err != nil || sb.State != api.StateReady {
		t.Fatalf("manager's get: %+v, %v", sb, err)
	}
}
