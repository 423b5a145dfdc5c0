package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/pgtest"
)

// TestServeFleetIdleEgressOnPostgres: under `serve --fleet` the node
// process pages its ctld's metering stream into the database with its
// cursor, so (1) an idle timer sees a sandbox's egress and keeps it
// alive while it sends, then fires once it stops, and a quiet sandbox
// beside it is destroyed on time; (2) across a SIGKILL and restart of the
// node process every record of the stream is stored once, none lost.
func TestServeFleetIdleEgressOnPostgres(t *testing.T) {
	srv := pgtest.Start(t)
	f := newFleetEnv(t, srv, []string{"node-a"}, "--max-sandboxes", "4", "--poll", "100ms", "--usage-pull", "100ms")
	cs, _ := f.fleetReplicas(t, 1)
	c := cs[0]
	ctx := context.Background()
	n := f.nodes["node-a"]
	pc, err := pgx.Connect(ctx, f.db)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(ctx)
	stored := func() (count, top int64) {
		t.Helper()
		if err := pc.QueryRow(ctx, `SELECT count(*), COALESCE(max(seq), 0) FROM usage_records WHERE node_id = 'node-a'`).Scan(&count, &top); err != nil {
			t.Fatal(err)
		}
		return count, top
	}
	at := time.Now().UTC()
	var last uint64 // the stream's newest sequence number
	add := func(id string, gen, tx uint64) {
		at = at.Add(time.Second)
		last = n.AddUsage(api.UsageRecord{SandboxID: id, Generation: gen, Start: at.Add(-time.Second), End: at, Usage: api.Usage{CPUUsec: 1000, TxBytes: tx, TxPackets: tx / 100}}).Seq
	}

	busy, err := c.Create(ctx, client.CreateRequest{Template: "busybox", IdleTimeoutSec: 3})
	if err != nil {
		t.Fatalf("create with an idle timeout under --fleet: %v", err)
	}
	quiet, err := c.Create(ctx, client.CreateRequest{Template: "busybox", IdleTimeoutSec: 3})
	if err != nil {
		t.Fatal(err)
	}
	// busy sends 500 bytes every 300 ms (a record of its node's stream
	// each), quiet nothing (records with no egress) for 7 s: more than
	// twice the idle timeout.
	start := time.Now()
	for time.Since(start) < 7*time.Second {
		add(busy.ID, busy.Generation, 500)
		add(quiet.ID, quiet.Generation, 0)
		time.Sleep(300 * time.Millisecond)
	}
	if sb, err := c.Get(ctx, quiet.ID); err != nil || sb.State != client.StateDestroyed {
		t.Fatalf("quiet sandbox after 7 s of an idle timeout of 3 s: %+v, %v; want destroyed", sb, err)
	}
	if sb, err := c.Get(ctx, busy.ID); err != nil || sb.State != client.StateReady {
		t.Fatalf("sandbox sending egress after 7 s of an idle timeout of 3 s: %+v, %v; want ready (egress is activity)", sb, err)
	}
	// It stops sending: the timer fires.
	stopped := time.Now()
	waitSandbox(t, c, busy.ID, func(sb client.Sandbox) bool { return sb.State == client.StateDestroyed })
	t.Logf("busy sandbox destroyed %v after its egress stopped (idle timeout 3 s)", time.Since(stopped).Round(100*time.Millisecond))

	// The stream into the database across a node process's SIGKILL.
	for range 5 {
		add("other", 1, 0)
	}
	want := int64(last)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if cnt, _ := stored(); cnt == want {
			break
		}
		if time.Now().After(deadline) {
			cnt, top := stored()
			t.Fatalf("%d records stored (top %d), want %d", cnt, top, want)
		}
	}
	f.restartNode("node-a")
	for range 7 {
		add("other", 1, 0)
	}
	want = int64(last)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if cnt, top := stored(); cnt == want && top == want {
			break
		}
		if time.Now().After(deadline) {
			cnt, top := stored()
			t.Fatalf("after the node process's restart: %d records stored (top %d), want %d", cnt, top, want)
		}
	}
	var cursor int64
	if err := pc.QueryRow(ctx, `SELECT last_seq FROM usage_cursors WHERE node_id = 'node-a'`).Scan(&cursor); err != nil || cursor != want {
		t.Fatalf("cursor %d, %v; want %d", cursor, err, want)
	}
	t.Logf("%d records of the node's stream stored once each across the node process's restart", want)
}
