package node

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/ctld/ctld/internal/journal"
	"golang.org/x/sys/unix"
)

// Capacity is an amount of each resource the node hands out.
type Capacity struct {
	CPUMillis   int64
	MemoryBytes int64
	PIDs        int64
	NBDDevices  int64
	Addresses   int64
	DiskBytes   int64
}

// Ledger is the node's capacity ledger. Allocatable = total - reserve;
// free = allocatable - leased - warm - withheld. Warm is what the warm
// pool's members hold (never in Leased: a member a claim takes leaves Warm
// and its claim's resources enter Leased in the same transaction); a
// withheld member counts in Withheld.
type Ledger struct {
	Total, Allocatable, Leased, Warm, Withheld Capacity
}

// HostCapacity reads the host's real CPUs, memory, PID limit, NBD devices
// and scratch disk.
func HostCapacity(scratchDir string) (Capacity, error) {
	var c Capacity
	c.CPUMillis = int64(runtime.NumCPU()) * 1000
	mem, err := memTotal("/proc/meminfo")
	if err != nil {
		return c, err
	}
	c.MemoryBytes = mem
	pidMax, err := readInt("/proc/sys/kernel/pid_max")
	if err != nil {
		return c, err
	}
	threadsMax, err := readInt("/proc/sys/kernel/threads-max")
	if err != nil {
		return c, err
	}
	c.PIDs = min(pidMax, threadsMax)
	nbd, _ := filepath.Glob("/sys/block/nbd*")
	c.NBDDevices = int64(len(nbd))
	// Disk is the scratch filesystem's size: leases are counted against it
	// (minus the reserve for the journal, templates and the host), not
	// against what happens to be free now.
	var st unix.Statfs_t
	if err := unix.Statfs(scratchDir, &st); err != nil {
		return c, fmt.Errorf("statfs scratch dir %s: %w", scratchDir, err)
	}
	c.DiskBytes = int64(st.Blocks) * st.Bsize
	return c, nil
}

func memTotal(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 && fs[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(fs[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse MemTotal in %s: %w", path, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no MemTotal in %s", path)
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return v, nil
}

// held is what a record holds: its resources (its lease's pids.max counts
// the runtime's allowance too) and its address block.
func held(s journal.Sandbox) Capacity {
	c := asCapacity(s.Resources)
	c.PIDs += s.RuntimePIDs
	if s.Slot != 0 {
		c.Addresses = 1
	}
	return c
}

func asCapacity(r journal.Resources) Capacity {
	return Capacity{CPUMillis: r.CPUMillis, MemoryBytes: r.MemoryBytes, PIDs: r.PIDs, DiskBytes: r.DiskBytes}
}

func add(a, b Capacity) Capacity {
	return Capacity{
		CPUMillis: a.CPUMillis + b.CPUMillis, MemoryBytes: a.MemoryBytes + b.MemoryBytes,
		PIDs: a.PIDs + b.PIDs, NBDDevices: a.NBDDevices + b.NBDDevices,
		Addresses: a.Addresses + b.Addresses, DiskBytes: a.DiskBytes + b.DiskBytes,
	}
}

func sub(a, b Capacity) Capacity {
	neg := Capacity{
		CPUMillis: -b.CPUMillis, MemoryBytes: -b.MemoryBytes, PIDs: -b.PIDs,
		NBDDevices: -b.NBDDevices, Addresses: -b.Addresses, DiskBytes: -b.DiskBytes,
	}
	r := add(a, neg)
	r.CPUMillis, r.MemoryBytes, r.PIDs = max(r.CPUMillis, 0), max(r.MemoryBytes, 0), max(r.PIDs, 0)
	r.NBDDevices, r.Addresses, r.DiskBytes = max(r.NBDDevices, 0), max(r.Addresses, 0), max(r.DiskBytes, 0)
	return r
}

// ledger derives the capacity ledger from the journal's sandbox records, so
// capacity comes back exactly in the transaction that marks a generation
// released (the one that stores its clean proof).
func ledger(total, reserve Capacity, ss []journal.Sandbox, members []journal.WarmMember) Ledger {
	c := Ledger{Total: total, Allocatable: sub(total, reserve)}
	for _, s := range ss {
		switch {
		case s.Withheld:
			c.Withheld = add(c.Withheld, held(s))
		case s.Holds():
			c.Leased = add(c.Leased, held(s))
		}
	}
	for _, m := range members {
		if m.Rec.Withheld {
			c.Withheld = add(c.Withheld, held(m.Rec))
		} else {
			c.Warm = add(c.Warm, held(m.Rec))
		}
	}
	return c
}

// fits reports whether r fits in what is neither leased nor withheld, and
// if not, which resource is short.
func fits(c Ledger, r journal.Resources) (bool, string) {
	free := sub(sub(sub(c.Allocatable, c.Leased), c.Warm), c.Withheld)
	switch {
	case r.CPUMillis > free.CPUMillis:
		return false, fmt.Sprintf("cpu: asked %dm, free %dm", r.CPUMillis, free.CPUMillis)
	case r.MemoryBytes > free.MemoryBytes:
		return false, fmt.Sprintf("memory: asked %d bytes, free %d", r.MemoryBytes, free.MemoryBytes)
	case r.PIDs > free.PIDs:
		return false, fmt.Sprintf("pids: asked %d, free %d", r.PIDs, free.PIDs)
	case r.DiskBytes > free.DiskBytes:
		return false, fmt.Sprintf("disk: asked %d bytes, free %d", r.DiskBytes, free.DiskBytes)
	}
	return true, ""
}
