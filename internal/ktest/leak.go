package ktest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/names"
	"github.com/google/nftables"
)

// HostState is the set of kernel objects a test could leak, rendered as
// sorted strings so two snapshots compare as plain data.
type HostState struct {
	Cgroups   []string // directories under CgroupRoot
	Mounts    []string // mount points from /proc/self/mountinfo
	Netns     []string // named netns under /run/netns
	Links     []string // links of the current netns
	NftTables []string // family/name of nftables tables in the current netns
	NBD       []string // connected nbd devices (pid file present)
	Runsc     []string // root:container of each runsc state root asked for
	Procs     []string // pid:comm of processes whose comm starts with runsc
	FDs       int      // open fds of this process
	// Files are the per-generation files and directories under ctld's run
	// and state dirs (see GenerationFiles).
	Files  []string
	Quotas []string // project quotas with a limit or usage (disk leases)
	Loops  []string // attached loop devices
}

// SnapshotOptions names the runsc state roots to list, and ctld's run and
// state dirs whose per-generation files to list.
type SnapshotOptions struct {
	RunscRoots []string
	RunDir     string
	StateDir   string
}

// isGenerationFile reports whether a file is named as ctld names a
// generation's files: "<sandbox id>-g<generation>" (names.ParseGeneration),
// or a log file of the layout before per-generation log directories.
func isGenerationFile(n string) bool {
	for _, suffix := range []string{".init.log", ".log", ".debug"} {
		if base, ok := strings.CutSuffix(n, suffix); ok {
			n = base
			break
		}
	}
	_, _, ok := names.ParseGeneration(n)
	return ok
}

// GenerationFiles lists the entries that belong to one generation in the
// directories where ctld keeps them: <run>/bundles, <run>/runsc.logs,
// <state>/scratch, and block mode's <state>/writers and <state>/blockroot.
// Only generation-named entries count, so the journal,
// keys, sockets, templates and runsc's own runsc.log are never reported.
func GenerationFiles(runDir, stateDir string) []string {
	var dirs []string
	if runDir != "" {
		dirs = append(dirs, filepath.Join(runDir, "bundles"), filepath.Join(runDir, "runsc.logs"), filepath.Join(runDir, "agents"))
	}
	if stateDir != "" {
		dirs = append(dirs, filepath.Join(stateDir, "scratch"), filepath.Join(stateDir, "writers"), filepath.Join(stateDir, "writers", "vol"), filepath.Join(stateDir, "blockroot"))
	}
	var out []string
	for _, d := range dirs {
		for _, n := range dirNames(d) {
			if isGenerationFile(n) {
				out = append(out, filepath.Join(d, n))
			}
		}
	}
	sort.Strings(out)
	return out
}

// Snapshot reads the current host state.
func Snapshot(opts SnapshotOptions) (HostState, error) {
	var s HostState
	var err error
	if s.Cgroups, err = cgroupDirs(CgroupRoot); err != nil {
		return s, err
	}
	if s.Mounts, err = mountPoints(); err != nil {
		return s, err
	}
	s.Netns = dirNames("/run/netns")
	ifs, err := net.Interfaces()
	if err != nil {
		return s, fmt.Errorf("list links: %w", err)
	}
	for _, i := range ifs {
		s.Links = append(s.Links, i.Name)
	}
	sort.Strings(s.Links)
	if s.NftTables, err = nftTables(); err != nil {
		return s, err
	}
	s.NBD = connectedNBD()
	for _, root := range opts.RunscRoots {
		ids, err := runscList(root)
		if err != nil {
			return s, err
		}
		for _, id := range ids {
			s.Runsc = append(s.Runsc, root+":"+id)
		}
	}
	s.Procs = runscProcs()
	s.FDs = len(dirNames("/proc/self/fd"))
	s.Files = GenerationFiles(opts.RunDir, opts.StateDir)
	if s.Quotas, err = projectQuotas(); err != nil {
		return s, err
	}
	s.Loops = attachedLoops()
	return s, nil
}

// Diff describes what after has that before did not (leaks) in one line per
// kind. An empty result means nothing leaked.
func Diff(before, after HostState) []string {
	var out []string
	add := func(kind string, b, a []string) {
		var extra []string
		for _, x := range a {
			if !slices.Contains(b, x) {
				extra = append(extra, x)
			}
		}
		if len(extra) > 0 {
			out = append(out, fmt.Sprintf("%s left behind: %s", kind, strings.Join(extra, ", ")))
		}
	}
	add("cgroups", before.Cgroups, after.Cgroups)
	add("mounts", before.Mounts, after.Mounts)
	add("netns", before.Netns, after.Netns)
	add("links", before.Links, after.Links)
	add("nft tables", before.NftTables, after.NftTables)
	add("nbd devices", before.NBD, after.NBD)
	add("runsc containers", before.Runsc, after.Runsc)
	add("runsc processes", before.Procs, after.Procs)
	add("generation files", before.Files, after.Files)
	add("project quotas", before.Quotas, after.Quotas)
	add("loop devices", before.Loops, after.Loops)
	if after.FDs > before.FDs {
		out = append(out, fmt.Sprintf("fds: %d open before, %d after", before.FDs, after.FDs))
	}
	return out
}

// CheckLeaks snapshots the host now and registers a cleanup that fails the
// test if anything new is left when the test (and its later cleanups) end.
// Call it first in a test so its cleanup runs last.
func CheckLeaks(t testing.TB, opts SnapshotOptions) {
	t.Helper()
	before, err := Snapshot(opts)
	if err != nil {
		t.Fatalf("leak snapshot: %v", err)
	}
	t.Cleanup(func() {
		// Processes and fds can take a moment to go after their owner
		// returned (reaping, deferred closes); allow a short settle.
		var leaks []string
		for i := 0; i < 50; i++ {
			after, err := Snapshot(opts)
			if err != nil {
				t.Errorf("leak snapshot: %v", err)
				return
			}
			if leaks = Diff(before, after); len(leaks) == 0 {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		for _, l := range leaks {
			t.Errorf("leak: %s", l)
		}
	})
}

func cgroupDirs(root string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // removed while walking
			}
			return err
		}
		if d.IsDir() && p != root {
			out = append(out, strings.TrimPrefix(p, root+"/"))
		}
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("walk cgroups %s: %w", root, err)
	}
	return out, nil
}

func mountPoints() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		// /run/netns made a mount point of its own (ctld's
		// Netns.Prepare, or iproute2) stays so by design: no leak.
		if len(f) > 4 && f[4] != "/run/netns" {
			out = append(out, f[4])
		}
	}
	sort.Strings(out)
	return out, nil
}

func dirNames(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func nftTables() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables conn: %w", err)
	}
	defer c.CloseLasting()
	ts, err := c.ListTables()
	if err != nil {
		return nil, fmt.Errorf("list nft tables: %w", err)
	}
	var out []string
	for _, tb := range ts {
		out = append(out, fmt.Sprintf("%d/%s", tb.Family, tb.Name))
	}
	sort.Strings(out)
	return out, nil
}

func connectedNBD() []string {
	var out []string
	for _, d := range dirNames("/sys/block") {
		if !strings.HasPrefix(d, "nbd") {
			continue
		}
		if _, err := os.Stat(filepath.Join("/sys/block", d, "pid")); err == nil {
			out = append(out, d)
		}
	}
	return out
}

func runscList(root string) ([]string, error) {
	if _, err := os.Stat(root); os.IsNotExist(err) {
		return nil, nil
	}
	out, err := exec.Command("runsc", "--root", root, "list", "-quiet").Output()
	if err != nil {
		return nil, fmt.Errorf("runsc --root %s list: %w", root, err)
	}
	ids := strings.Fields(string(out))
	sort.Strings(ids)
	return ids, nil
}

func runscProcs() []string {
	var out []string
	for _, p := range dirNames("/proc") {
		if p[0] < '0' || p[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", p, "comm"))
		if err != nil {
			continue
		}
		comm := strings.TrimSpace(string(b))
		if strings.HasPrefix(comm, "runsc") || strings.HasPrefix(comm, "exe") && isRunscExe(p) {
			out = append(out, p+":"+comm)
		}
	}
	return out
}

// isRunscExe catches runsc's re-exec'd children, whose comm is "exe".
func isRunscExe(pid string) bool {
	target, err := os.Readlink(filepath.Join("/proc", pid, "exe"))
	return err == nil && strings.Contains(filepath.Base(target), "runsc")
}

// DeleteNftTable deletes the inet table name if it exists: ctld never
// deletes its own table, so a test that ran ctld on a table of its own
// deletes it once ctld stopped.
func DeleteNftTable(name string) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return err
	}
	for _, tb := range tables {
		if tb.Name == name {
			c.DelTable(tb)
			return c.Flush()
		}
	}
	return nil
}

// NftTable is a fresh inet table name, prefix and random hex, for a test
// that runs a firewall on a table of its own; the test's end deletes the
// table. Call it after CheckLeaks, so the table is gone before the leak
// check looks.
func NftTable(t testing.TB, prefix string) string {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	name := prefix + hex.EncodeToString(b)
	t.Cleanup(func() {
		if err := DeleteNftTable(name); err != nil {
			t.Errorf("delete nft table %s: %v", name, err)
		}
	})
	return name
}
