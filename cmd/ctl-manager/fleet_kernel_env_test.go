package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/nodechannel/channeltest"
	"github.com/ctld/ctld/internal/pgtest"
)

// kernelFleet is issue 24's fleet in one VM: one PostgreSQL, isolated real
// ctlds (startIsolatedCtld) each with its `node run` process, and
// `serve --fleet` replicas on the one database, all child processes.
type kernelFleet struct {
	t        *testing.T
	env      *env
	srv      *pgtest.Server
	st       *manager.Store // the test's own view of the database
	ctlds    []*isolatedCtld
	procs    []*serveChild
	ids      []string       // node ids, by ctld index
	nodeOf   map[string]int // ctld index, by node id
	replicas []*serveChild
	clients  []*client.Client // one per replica
	max      int64            // --max-sandboxes of each node
}

// startKernelFleet starts nodes isolated ctlds with their node processes
// (each taking at most max sandboxes) and replicas `serve --fleet`
// replicas, and waits until every node is registered.
func startKernelFleet(t *testing.T, nodes, replicas int, max int64) *kernelFleet {
	t.Helper()
	ctx := context.Background()
	srv := pgtest.Start(t)
	f := &kernelFleet{t: t, srv: srv, env: &env{t: t, db: srv.NewDatabase(t)}, nodeOf: map[string]int{}, max: max}
	ca := channeltest.NewCA(t, "cluster")
	for i := range nodes {
		// Three guests booting at once on a TCG VM of a loaded host took
		// over ctld's default 2m ready timeout: 4m here (the replicas'
		// create timeout is 5m).
		c, id, proc := f.env.startFleetNode(ctx, ca, i, []string{"--ready-timeout", "4m"}, "--max-sandboxes", fmt.Sprint(max), "--ttl", "10s", "--grace", "20s",
			// Claims come by LISTEN/NOTIFY: polling every 200 ms too, three
			// node processes took CPU the booting guests lacked under TCG.
			"--poll", "1s")
		f.ctlds = append(f.ctlds, c)
		f.ids = append(f.ids, id)
		f.nodeOf[id] = i
		f.procs = append(f.procs, proc)
	}
	if len(f.nodeOf) != nodes {
		t.Fatalf("node ids %v are not distinct", f.ids)
	}
	key := f.env.fleetOwner()
	for i := range replicas {
		// A 10s operation lease: at 1s, renewals running late under TCG
		// let the other replica take live creates over (260 takeovers in
		// one run); a killed replica's calls wait 10s for it.
		r, c := f.env.startFleetReplica(ca, key, "--template", "busybox", "--create-timeout", "5m", "--lease-ttl", "10s", "--replica-id", fmt.Sprintf("replica-%d", i))
		f.replicas = append(f.replicas, r)
		f.clients = append(f.clients, c)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, r := range f.replicas {
				t.Logf("replica %d:\n%s", i, r.stderr())
			}
			for i, p := range f.procs {
				t.Logf("node process %d:\n%s", i, p.stderr())
			}
		}
	})
	f.st = f.env.fleetStore(ctx, nodes)
	return f
}

func (f *kernelFleet) ctld(i int) *api.Client { return &api.Client{SocketPath: f.ctlds[i].socket} }

// overCapacity says how a node is over its allocatable now, from the
// database's reservations and from each ctld's own ledger ("" if none).
func (f *kernelFleet) overCapacity(ctx context.Context) (string, error) {
	var over []string
	ns, err := f.st.FleetNodes(ctx)
	if err != nil {
		return "", err
	}
	for _, n := range ns {
		if !n.Reserved.Fits(n.Allocatable) {
			over = append(over, fmt.Sprintf("database: node %s reserved %+v of %+v", n.NodeID, n.Reserved, n.Allocatable))
		}
	}
	for i := range f.ctlds {
		n, err := f.ctld(i).Node(ctx)
		if err != nil {
			return "", err
		}
		l, a := n.Capacity.Leased, n.Capacity.Allocatable
		if l.CPUMillis > a.CPUMillis || l.MemoryBytes > a.MemoryBytes || l.PIDs > a.PIDs || l.Addresses > a.Addresses || l.DiskBytes > a.DiskBytes {
			over = append(over, fmt.Sprintf("ctld %d leases %+v of %+v", i, l, a))
		}
		list, err := f.ctld(i).List(ctx)
		if err != nil {
			return "", err
		}
		live := 0
		for _, sb := range list.Sandboxes {
			if sb.State != api.StateReleased && sb.State != api.StateFailed {
				live++
			}
		}
		if int64(live) > f.max {
			over = append(over, fmt.Sprintf("ctld %d runs %d sandboxes, its node takes %d", i, live, f.max))
		}
	}
	return strings.Join(over, "; "), nil
}

// sampleCapacity checks overCapacity every second (more often took
// the CPU the booting guests need under TCG) until the returned stop
// is called; stop returns how many samples were taken (errors of a
// database that is down are not samples).
func (f *kernelFleet) sampleCapacity(t *testing.T) (stop func() int) {
	var n atomic.Int64
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Second):
			}
			over, err := f.overCapacity(context.Background())
			if err != nil {
				continue
			}
			n.Add(1)
			if over != "" {
				t.Errorf("over capacity: %s", over)
			}
		}
	}()
	var once sync.Once
	stop = func() int { once.Do(func() { close(done); <-exited }); return int(n.Load()) }
	t.Cleanup(func() { stop() })
	return stop
}

// checkRunsWhereRecorded fails unless sandbox id is ready on the ctld the
// database places it on, and on no other.
func (f *kernelFleet) checkRunsWhereRecorded(ctx context.Context, id string) error {
	rec, err := f.st.Sandbox(ctx, id)
	if err != nil {
		return err
	}
	on, ok := f.nodeOf[rec.NodeID]
	if !ok {
		return fmt.Errorf("%s placed on unknown node %q", id, rec.NodeID)
	}
	for i := range f.ctlds {
		got, err := f.ctld(i).Get(ctx, id)
		if ready := err == nil && got.State == api.StateReady && got.Generation == rec.Generation; ready != (i == on) {
			return fmt.Errorf("%s (generation %d) placed on node %d; on ctld %d: %+v, %v", id, rec.Generation, on, i, got, err)
		}
	}
	return nil
}

// retrying calls fn until it succeeds, fn's error is not retryable
// (retry reports which are), or the deadline passes; it waits between
// calls as the service's Retry-After says (at least 1 s), backing off
// and jittered: a full fleet refuses many creates at once, and under
// emulation every refused call costs the guests' CPU.
func retrying(ctx context.Context, limit time.Duration, retry func(error) bool, fn func() error) error {
	deadline := time.Now().Add(limit)
	for attempt := 0; ; {
		err := fn()
		if err == nil || !retry(err) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still failing after %v: %w", limit, err)
		}
		wait := time.Second
		var ce *client.Error
		if errors.As(err, &ce) && ce.RetryAfter > wait {
			wait = ce.RetryAfter
		}
		// Growing to 8 s while it keeps failing, jittered.
		wait = min(wait<<min(attempt, 3), 8*time.Second)
		attempt++
		wait += time.Duration(rand.Int64N(int64(wait)))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// codeOf is the service's error code of err ("" if none).
func codeOf(err error) string {
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	return ""
}

// settled waits until the database has no pending operation and no
// sandbox claiming or releasing.
func (f *kernelFleet) settled(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		var busy []string
		sbs, err := f.st.Sandboxes(ctx)
		if err == nil {
			for _, sb := range sbs {
				if sb.State == api.StateClaiming || sb.State == api.StateReleasing {
					busy = append(busy, sb.ID+" "+string(sb.State))
				}
			}
			if len(busy) == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not settled after %v: %v %v", limit, busy, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkIdle fails unless no ctld leases anything and the database holds
// no reservation.
func (f *kernelFleet) checkIdle(ctx context.Context) error {
	for i := range f.ctlds {
		n, err := f.ctld(i).Node(ctx)
		if err != nil || n.Capacity.Leased.CPUMillis != 0 || n.Capacity.Leased.MemoryBytes != 0 {
			return fmt.Errorf("ctld %d leases %+v, %v", i, n.Capacity.Leased, err)
		}
	}
	ns, err := f.st.FleetNodes(ctx)
	if err != nil {
		return err
	}
	for _, n := range ns {
		if n.Reserved != (manager.NodeAlloc{}) {
			return fmt.Errorf("node %s still has %+v reserved", n.NodeID, n.Reserved)
		}
	}
	return nil
}
