package fleettest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
)

// placeAll runs creates of ids (operation ids tagged with round) from
// workers goroutines spread over stores at once and returns each create's
// placements; any error fails t.
func placeAll(t *testing.T, stores []*manager.Store, round, workers int, ids []string, sp manager.Spec) map[string][]manager.Placement {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	out := map[string][]manager.Placement{}
	next := make(chan string)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[w%len(stores)]
			for id := range next {
				p, err := s.Place(ctx, manager.PlaceIntent{SandboxID: id, OperationID: fmt.Sprintf("c%d-%s-%d", round, id, w), Spec: sp})
				if err != nil {
					t.Errorf("place %s: %v", id, err)
					continue
				}
				mu.Lock()
				out[id] = append(out[id], p)
				mu.Unlock()
			}
		}()
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	wg.Wait()
	return out
}

// concurrentPlacementsDoNotAbort: creates from 16 goroutines over two
// handles on three roomy nodes all commit the first time: a placement
// locks only the node row it reserves on, so placements never abort each
// other as serialization conflicts (under SERIALIZABLE each read every
// node row the others wrote, and most were run again). They spread over
// the nodes, and each node's reserved sum is its active reservations.
func concurrentPlacementsDoNotAbort(t *testing.T, open Opener) {
	ctx := context.Background()
	a, b := open(t, newClock().now)
	big := manager.NodeAlloc{CPUMillis: 1 << 30, MemoryBytes: 1 << 40, DiskBytes: 1 << 40, Sandboxes: 1 << 20}
	for _, id := range []string{"n1", "n2", "n3"} {
		must(a.RegisterNode(ctx, newNode(id).reg(big, both)))(t)
	}
	before := a.Reruns() + b.Reruns()
	var ids []string
	for i := range 60 {
		ids = append(ids, fmt.Sprintf("s%d", i))
	}
	placed := placeAll(t, []*manager.Store{a, b}, 1, 16, ids, spec(100, api.RootFSOverlay, ""))
	if reruns := a.Reruns() + b.Reruns() - before; reruns != 0 {
		t.Errorf("%d placements aborted by the database and run again, want none", reruns)
	}
	on := map[string]int64{}
	for id, ps := range placed {
		if len(ps) != 1 || ps[0].Reused {
			t.Fatalf("%s placed %+v", id, ps)
		}
		on[ps[0].NodeID]++
	}
	for _, id := range []string{"n1", "n2", "n3"} {
		// Spread: the least loaded node wins each choice, so no node
		// holds much more than a third (a node's row held by another
		// placement passes the choice to the next).
		if on[id] < 10 || on[id] > 30 {
			t.Errorf("node %s got %d of 60 placements (%v), want them spread", id, on[id], on)
		}
		n := must(b.FleetNode(ctx, id))(t)
		if n.Reserved.Sandboxes != on[id] || n.Reserved.CPUMillis != 100*on[id] {
			t.Errorf("node %s reserved %+v, placed %d", id, n.Reserved, on[id])
		}
	}
	t.Logf("placed %v; %d reruns", on, a.Reruns()+b.Reruns()-before)
}

// concurrentCreatesOfOneSandbox: one sandbox created from 12 goroutines
// over two handles at once, each with its own operation id: one create
// places it, every other returns that pending claim (Reused); one
// generation, one reservation. The same again once that claim failed
// (the sandbox's row exists, terminal): one generation 2.
func concurrentCreatesOfOneSandbox(t *testing.T, open Opener) {
	ctx := context.Background()
	a, b := open(t, newClock().now)
	for _, id := range []string{"n1", "n2"} {
		must(a.RegisterNode(ctx, newNode(id).reg(small(), both)))(t)
	}
	ids := make([]string, 12)
	for i := range ids {
		ids[i] = "one"
	}
	for gen := uint64(1); gen <= 2; gen++ {
		ps := placeAll(t, []*manager.Store{a, b}, int(gen), 12, ids, spec(500, api.RootFSBlock, ""))["one"]
		var first manager.Placement
		fresh := 0
		for _, p := range ps {
			if !p.Reused {
				fresh++
				first = p
			}
		}
		if len(ps) != 12 || fresh != 1 {
			t.Fatalf("generation %d: %d creates answered, %d placed anew; want 12 and 1: %+v", gen, len(ps), fresh, ps)
		}
		for _, p := range ps {
			if p.NodeID != first.NodeID || p.Operation.OperationID != first.Operation.OperationID || p.Operation.Generation != gen {
				t.Fatalf("create answered %+v, the placement is %+v (generation %d)", p, first, gen)
			}
		}
		var held int64
		for _, id := range []string{"n1", "n2"} {
			held += must(b.FleetNode(ctx, id))(t).Reserved.Sandboxes
		}
		sb := must(b.Sandbox(ctx, "one"))(t)
		if held != 1 || sb.Generation != gen || sb.NodeID != first.NodeID {
			t.Fatalf("%d reservations held, sandbox %+v; want 1 and generation %d on %s", held, sb, gen, first.NodeID)
		}
		if err := a.FailPlacedClaim(ctx, first.Operation.OperationID, "refused by the test"); err != nil {
			t.Fatal(err)
		}
	}
}
