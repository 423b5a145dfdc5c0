package fakekernel

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/ctld/ctld/internal/agent/client"
	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/lease"
	"github.com/ctld/ctld/internal/runsc"
)

// TestWarmAgentClaim: a guest whose spec runs a warm agent (a pool
// member's) answers ready with its boot nonce, takes one claim (invalid
// without a command, exists the second time) and answers the claim's
// nonce from then on, as ctl-agent --warm does; a cold agent refuses.
func TestWarmAgentClaim(t *testing.T) {
	k := newKernel(t)
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	start := func(cid string, warm bool) *client.Client {
		must(os.MkdirAll(k.Runtime().ContainerLogDir(cid), 0o700))
		must(k.Leases().Create(ctx, lease.Spec{ID: cid, CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 64}))
		root, err := k.RootFS().Mount(ctx, cid, filepath.Join(k.TemplatesDir(), "busybox"))
		must(err)
		ns, err := k.Netns().Create(ctx, cid)
		must(err)
		dir := filepath.Join(k.RunDir(), "agents", cid)
		for _, d := range []string{filepath.Join(dir, "bin"), filepath.Join(dir, "sock")} {
			must(os.MkdirAll(d, 0o700))
		}
		must(os.WriteFile(filepath.Join(dir, "bin", runsc.AgentBinary), nil, 0o755))
		must(os.WriteFile(filepath.Join(dir, "sock", runsc.AgentNonce), []byte("boot-"+cid), 0o400))
		bs := runsc.BundleSpec{ContainerID: cid, RootPath: root, NetnsPath: ns, CgroupsPath: k.Leases().CgroupsPath(cid),
			Agent: &runsc.Agent{BinDir: filepath.Join(dir, "bin"), SocketDir: filepath.Join(dir, "sock"), Warm: warm}}
		if !warm {
			bs.Args = []string{"/bin/sleep", "1"}
		}
		spec, err := runsc.BuildSpec(bs)
		must(err)
		bundle := filepath.Join(k.RunDir(), "bundles", cid)
		must(runsc.WriteBundle(bundle, spec))
		must(k.Runtime().Create(ctx, cid, bundle))
		must(k.Runtime().Start(ctx, cid))
		return &client.Client{Socket: filepath.Join(dir, "sock", runsc.AgentSocket)}
	}
	code := func(err error) string {
		var we *wire.Error
		if errors.As(err, &we) {
			return we.Code
		}
		return ""
	}
	c := start("warm-g1", true)
	if got, err := c.Ready(ctx); err != nil || got != "boot-warm-g1" {
		t.Fatalf("member ready = %q, %v", got, err)
	}
	if _, err := c.Claim(ctx, client.ClaimRequest{Nonce: "n1"}); code(err) != wire.CodeInvalid {
		t.Errorf("claim without a command = %v, want invalid", err)
	}
	if got, err := c.Claim(ctx, client.ClaimRequest{Nonce: "n1", Args: []string{"sleep", "1"}}); err != nil || got != "n1" {
		t.Fatalf("claim = %q, %v", got, err)
	}
	if got, err := c.Ready(ctx); err != nil || got != "n1" {
		t.Errorf("ready after the claim = %q, %v; want the claim's nonce", got, err)
	}
	if _, err := c.Claim(ctx, client.ClaimRequest{Nonce: "n2", Args: []string{"sleep", "1"}}); code(err) != wire.CodeExists {
		t.Errorf("second claim = %v, want exists", err)
	}
	cold := start("cold-g1", false)
	if _, err := cold.Claim(ctx, client.ClaimRequest{Nonce: "n3", Args: []string{"sleep", "1"}}); code(err) != wire.CodeInvalid {
		t.Errorf("claim on a cold agent = %v, want invalid", err)
	}
}
