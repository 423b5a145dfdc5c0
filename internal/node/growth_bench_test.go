package node

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/journal/journaltest"
	"github.com/ctld/ctld/internal/lease"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node/guest"
	"github.com/ctld/ctld/internal/node/network"
	"github.com/ctld/ctld/internal/node/overlay"
	"github.com/ctld/ctld/internal/rootfs"
	"github.com/ctld/ctld/internal/runsc"
)

// growthNode is a node whose kernel-facing parts point at empty temp dirs
// (so Reconcile finds nothing to adopt or sweep) over a journal holding
// history finished generations.
func growthNode(b testing.TB, history int) *Node {
	b.Helper()
	dir := b.TempDir()
	j, err := journal.Open(filepath.Join(dir, "journal.db"), time.Second)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { j.Close() })
	if err := j.TakeOver(2); err != nil {
		b.Fatal(err)
	}
	if err := journaltest.SeedFinished(j, "hist", history); err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "cgroup", "ctld.slice"), 0o755); err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	return New(Config{Slot: "a", StateDir: dir, RunDir: filepath.Join(dir, "run")}, Deps{
		Journal: j, Answers: testAnswers{}, Epoch: 2, Logger: log,
		Guest: guest.Deps{
			Leases:  &lease.Manager{Root: filepath.Join(dir, "cgroup"), Parent: "ctld.slice", Logger: log},
			Runtime: &runsc.Runtime{Root: filepath.Join(dir, "runsc"), Logger: log},
		},
		Overlay: overlay.Deps{RootFS: &rootfs.Overlay{ScratchDir: filepath.Join(dir, "scratch"), Logger: log}},
		Network: network.Deps{Netns: &netpolicy.Netns{Dir: filepath.Join(dir, "netns"), Logger: log}},
		Total:   Capacity{CPUMillis: 64000, MemoryBytes: 256 << 30, PIDs: 1 << 22},
	})
}

// admitOnce runs a claim's admission transaction (the part of Claim that
// reads the journal under its write lock) and returns how long it took,
// then finishes the generation so every call admits against the same
// live set.
func admitOnce(b testing.TB, n *Node, i int) time.Duration {
	id := fmt.Sprintf("bench%d", i)
	req := journal.ClaimRequest{OperationID: "claim-" + id, Generation: 1,
		Resources: journal.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PIDs: 128}}
	rec := journal.Sandbox{ID: id, Generation: 1, State: journal.StateClaiming, Resources: req.Resources, ClaimOp: req.OperationID, Request: &req}
	op := journal.Operation{ID: req.OperationID, Kind: "claim", SandboxID: id, Generation: 1, State: journal.OpPending}
	t0 := time.Now()
	op, started, err := n.beginOp(context.Background(), op, func(tx *journal.Tx) error { return n.admitClaim(tx, rec) })
	took := time.Since(t0)
	if err != nil || !started {
		b.Fatalf("admit %s: started=%v %v", id, started, err)
	}
	n.endOp(op.ID)
	err = n.d.Journal.Update(func(tx *journal.Tx) error {
		rec.State = journal.StateReleased
		op.State = journal.OpDone
		if err := tx.PutSandbox(rec); err != nil {
			return err
		}
		return tx.PutOperation(op)
	})
	if err != nil {
		b.Fatal(err)
	}
	return took
}

// BenchmarkJournalGrowth measures what history costs the hot paths: a
// claim's admission transaction (idempotency lookup, ledger, pending
// record), GET /v1/node's ledger and a takeover's Reconcile, each on an
// empty journal and on one holding 10,000 finished generations. The two
// journals are measured in alternating rounds of the same run (so machine
// noise hits both alike); it prints the medians of all calls and their
// ratios (goal <= 1.2) and reports the ratios as metrics.
// Run: go test -run '^$' -bench JournalGrowth -benchtime 1x ./internal/node/
func BenchmarkJournalGrowth(b *testing.B) {
	const rounds, per = 31, 10
	nodes := []*Node{growthNode(b, 0), growthNode(b, 10000)}
	next := 0
	kinds := []struct {
		name string
		fn   func(n *Node) time.Duration
	}{
		{"claim-admit", func(n *Node) time.Duration { next++; return admitOnce(b, n, next) }},
		{"node-ledger", func(n *Node) time.Duration {
			t0 := time.Now()
			if _, err := n.Node(context.Background()); err != nil {
				b.Fatal(err)
			}
			return time.Since(t0)
		}},
		{"reconcile", func(n *Node) time.Duration {
			t0 := time.Now()
			if err := n.Reconcile(context.Background()); err != nil {
				b.Fatal(err)
			}
			return time.Since(t0)
		}},
	}
	for i := 0; i < b.N; i++ {
		for _, k := range kinds {
			samples := [2][]float64{}
			for r := 0; r < rounds; r++ {
				for s, n := range nodes {
					for range per {
						samples[s] = append(samples[s], float64(k.fn(n).Nanoseconds())/1000)
					}
				}
			}
			empty, full := median(samples[0]), median(samples[1])
			b.Logf("%-12s empty %9.1f µs  10k finished %9.1f µs  ratio %.2f (goal <= 1.2; medians of %d calls each)", k.name, empty, full, full/empty, rounds*per)
			b.ReportMetric(full/empty, "ratio-"+k.name)
		}
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
