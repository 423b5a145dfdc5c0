package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/pgtest"
)

// TestNodeDrainOnPostgres: `node drain` of a node holding two block
// sandboxes and an overlay one (a `serve --fleet` replica, two node
// processes over fake ctlds, a real PostgreSQL): new creates go to the
// other node, both block sandboxes are paused through the drained node's
// process (released on its ctld with verified proofs, shown paused by
// the service with a paused event) and resume on the other node; the
// overlay one, which cannot move, is listed as left, and `--wait` fails
// while it runs and succeeds once it is destroyed. Progress is printed.
func TestNodeDrainOnPostgres(t *testing.T) {
	srv := pgtest.Start(t)
	f := newFleetEnv(t, srv, []string{"node-a", "node-b"}, "--max-sandboxes", "4", "--poll", "100ms")
	cs, _ := f.fleetReplicas(t, 1, "--template", "debian:block")
	c, e := cs[0], f.env
	ctx := context.Background()
	pc, err := pgx.Connect(ctx, f.db)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(ctx)
	nodeOf := func(id string) string {
		t.Helper()
		var n string
		if err := pc.QueryRow(ctx, `SELECT node_id FROM sandboxes WHERE id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	e.ok("node", "cordon", "node-b")
	var blocks []client.Sandbox
	for range 2 {
		sb, err := c.Create(ctx, client.CreateRequest{Template: "debian"})
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, sb)
	}
	ov, err := c.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range append(blocks, ov) {
		if n := nodeOf(sb.ID); n != "node-a" {
			t.Fatalf("%s placed on %s with node-b cordoned", sb.ID, n)
		}
	}
	e.ok("node", "uncordon", "node-b")

	out := e.ok("node", "drain", "node-a")
	for _, want := range []string{"node node-a: 1 paused, 0 failed, 2 left", "node node-a: 2 paused, 0 failed, 1 left", "still on the node: " + ov.ID + " (overlay, ready)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("drain output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("node drain:\n%s", out)
	for _, sb := range blocks {
		got, err := c.Get(ctx, sb.ID)
		if err != nil || got.State != client.StatePaused {
			t.Fatalf("block sandbox %s after the drain: %+v, %v; want paused", sb.ID, got, err)
		}
		if n, err := f.nodes["node-a"].Get(ctx, sb.ID); err != nil || n.State != api.StateReleased {
			t.Fatalf("block sandbox %s on node-a's ctld: %+v, %v; want released", sb.ID, n, err)
		}
	}
	var verified, pausedEvents int
	if err := pc.QueryRow(ctx, `SELECT (SELECT count(*) FROM proofs WHERE sandbox_id IN ($1, $2) AND verified = 1),
		(SELECT count(*) FROM service_events WHERE type = 'paused' AND reason = 'drain of node node-a')`, blocks[0].ID, blocks[1].ID).Scan(&verified, &pausedEvents); err != nil {
		t.Fatal(err)
	}
	if verified != 2 || pausedEvents != 2 {
		t.Fatalf("%d verified proofs, %d paused events; want 2 and 2", verified, pausedEvents)
	}
	// New creates go elsewhere; the paused sandboxes resume elsewhere.
	sb, err := c.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil || nodeOf(sb.ID) != "node-b" {
		t.Fatalf("create during the drain: %+v, %v, on %s; want node-b", sb, err, nodeOf(sb.ID))
	}
	for _, b := range blocks {
		r, err := c.Resume(ctx, b.ID)
		if err != nil || r.State != client.StateReady || nodeOf(b.ID) != "node-b" {
			t.Fatalf("resume %s: %+v, %v, on %s; want ready on node-b", b.ID, r, err, nodeOf(b.ID))
		}
	}
	// The overlay sandbox keeps the node from being empty.
	if r := e.run("", "node", "drain", "node-a", "--wait", "500ms", "--poll", "100ms"); r.code == 0 || !strings.Contains(r.stderr, "1 sandboxes still on the node") {
		t.Fatalf("drain --wait with an overlay sandbox running: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if _, err := c.Destroy(ctx, ov.ID); err != nil {
		t.Fatal(err)
	}
	if out := e.ok("node", "drain", "node-a", "--wait", "5s", "--poll", "100ms"); !strings.Contains(out, "node node-a: 0 paused, 0 failed, 0 left") {
		t.Fatalf("drain of an empty node:\n%s", out)
	}
}
