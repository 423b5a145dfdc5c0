package node

import (
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

// TestDiskLedger: disk leases are counted like CPU and memory: leased while
// a generation holds capacity, withheld while its cleanup is unproven, and
// a claim that does not fit the rest is refused naming disk.
func TestDiskLedger(t *testing.T) {
	total := Capacity{CPUMillis: 4000, MemoryBytes: 8 << 30, PIDs: 10000, DiskBytes: 10 << 30}
	reserve := Capacity{DiskBytes: 1 << 30}
	res := func(disk int64) journal.Resources {
		return journal.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 10, DiskBytes: disk}
	}
	ss := []journal.Sandbox{
		{ID: "a", State: journal.StateReady, Resources: res(4 << 30)},
		{ID: "b", State: journal.StateReleased, Resources: res(2 << 30), Withheld: true},
		{ID: "c", State: journal.StateReleased, Resources: res(8 << 30)},
	}
	c := ledger(total, reserve, ss)
	if c.Allocatable.DiskBytes != 9<<30 || c.Leased.DiskBytes != 4<<30 || c.Withheld.DiskBytes != 2<<30 {
		t.Fatalf("disk ledger: allocatable %d leased %d withheld %d; want 9, 4, 2 GiB", c.Allocatable.DiskBytes, c.Leased.DiskBytes, c.Withheld.DiskBytes)
	}
	if ok, why := fits(c, res(3<<30)); !ok {
		t.Fatalf("3 GiB of 3 GiB free refused: %s", why)
	}
	ok, why := fits(c, res(3<<30+1))
	if ok || !strings.HasPrefix(why, "disk:") {
		t.Fatalf("3 GiB + 1 byte of 3 GiB free: fits %v (%s), want refused on disk", ok, why)
	}
}

// TestDiskProjectAllocation: the lowest id of the range that no generation
// holding capacity uses; withheld generations keep theirs; a full range is
// capacity_exhausted.
func TestDiskProjectAllocation(t *testing.T) {
	n := &Node{cfg: Config{DiskProjects: DiskProjects{Base: 100, Count: 3}}}
	rec := func(state journal.State, p uint32, withheld bool) journal.Sandbox {
		return journal.Sandbox{State: state, DiskProject: p, Withheld: withheld}
	}
	for _, c := range []struct {
		name string
		all  []journal.Sandbox
		want uint32
	}{
		{"empty", nil, 100},
		{"ready holds", []journal.Sandbox{rec(journal.StateReady, 100, false)}, 101},
		{"released frees", []journal.Sandbox{rec(journal.StateReleased, 100, false)}, 100},
		{"withheld keeps", []journal.Sandbox{rec(journal.StateReleased, 100, true), rec(journal.StateClaiming, 101, false)}, 102},
		{"lost holds", []journal.Sandbox{rec(journal.StateLost, 100, false)}, 101},
	} {
		got, err := n.allocDiskProject(c.all)
		if err != nil || got != c.want {
			t.Errorf("%s: %d, %v; want %d", c.name, got, err, c.want)
		}
	}
	full := []journal.Sandbox{rec(journal.StateReady, 100, false), rec(journal.StateReady, 101, false), rec(journal.StateReleasing, 102, false)}
	if _, err := n.allocDiskProject(full); errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted {
		t.Fatalf("full range: %v, want capacity_exhausted", err)
	}
}

// TestDiskDefault: a claim without disk_bytes gets the node's default; one
// with it keeps its own.
func TestDiskDefault(t *testing.T) {
	n := &Node{cfg: Config{DefaultDiskBytes: 1 << 30}}
	if r := n.withDiskDefault(journal.Resources{}); r.DiskBytes != 1<<30 {
		t.Fatalf("default not applied: %d", r.DiskBytes)
	}
	if r := n.withDiskDefault(journal.Resources{DiskBytes: 5 << 20}); r.DiskBytes != 5<<20 {
		t.Fatalf("explicit disk_bytes replaced: %d", r.DiskBytes)
	}
	if err := (&Node{}).checkDisk(journal.Resources{}); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Fatalf("no disk lease and no default: %v, want invalid_argument", err)
	}
}
