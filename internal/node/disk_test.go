package node

import (
	"strings"
	"testing"

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
	c := ledger(total, reserve, ss, nil)
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
