// Package leasetest is the contract of guest.Leases, the node's view of a
// lease manager: one suite run against the fake kernel's leases on the
// host (internal/node/fakekernel) and against *lease.Manager on a real
// cgroup2 in the test VM (internal/lease), the way containerd's
// snapshots testsuite runs every snapshotter. A case that passes on one
// and fails on the other is a fake that lies.
package leasetest

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/lease"
	"github.com/ctld/ctld/internal/node/guest"
)

// Subject is one implementation under test.
type Subject struct {
	Leases guest.Leases
	// Populate puts a process of the test's into lease id (a guest's
	// stand-in) that lives until the lease is killed or removed.
	Populate func(t *testing.T, id string)
}

// New makes a fresh subject for one case; it cleans up after itself.
type New func(t *testing.T) Subject

// Run runs every case against the subjects newSubject makes.
func Run(t *testing.T, newSubject New) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, t.Context(), newSubject(t)) })
	}
}

// spec is a valid lease spec for id.
func spec(id string) lease.Spec {
	return lease.Spec{ID: id, CPUMillis: 250, MemoryBytes: 64 << 20, PIDs: 64}
}

func create(t *testing.T, ctx context.Context, l guest.Leases, id string) {
	t.Helper()
	if err := l.Create(ctx, spec(id)); err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
}

func listed(t *testing.T, ctx context.Context, l guest.Leases, id string) bool {
	t.Helper()
	ids, err := l.List(ctx)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	return slices.Contains(ids, id)
}

var cases = []struct {
	name string
	run  func(t *testing.T, ctx context.Context, s Subject)
}{
	{"a new lease is listed, empty and not gone", func(t *testing.T, ctx context.Context, s Subject) {
		l := s.Leases
		create(t, ctx, l, "lt-new")
		if !listed(t, ctx, l, "lt-new") {
			t.Error("a new lease is not listed")
		}
		if pop, err := l.Populated(ctx, "lt-new"); err != nil || pop {
			t.Errorf("populated = %v, %v; want false", pop, err)
		}
		if st, err := l.Stats(ctx, "lt-new"); err != nil || st.Procs != 0 || st.OOMKills != 0 {
			t.Errorf("stats = %+v, %v; want no process, no OOM kill", st, err)
		}
		if ok, detail := l.CheckGone(ctx, "lt-new"); ok || !strings.Contains(detail, "exists") {
			t.Errorf("check gone = %v %q; want not gone, saying it exists", ok, detail)
		}
		if d := l.Dir("lt-new"); !strings.HasSuffix(d, "/lt-new") {
			t.Errorf("dir = %q, want a path ending in the lease id", d)
		}
		if p := l.CgroupsPath("lt-new"); !strings.HasPrefix(p, "/") || !strings.HasSuffix(p, "/lt-new") {
			t.Errorf("cgroupsPath = %q, want an absolute cgroup path ending in the lease id", p)
		}
	}},
	{"a lease made twice is fs.ErrExist and keeps the first", func(t *testing.T, ctx context.Context, s Subject) {
		create(t, ctx, s.Leases, "lt-twice")
		if err := s.Leases.Create(ctx, spec("lt-twice")); !errors.Is(err, fs.ErrExist) {
			t.Errorf("second create: %v, want fs.ErrExist", err)
		}
		if !listed(t, ctx, s.Leases, "lt-twice") {
			t.Error("the first lease went with the refused second")
		}
	}},
	{"an invalid spec or id is refused and makes nothing", func(t *testing.T, ctx context.Context, s Subject) {
		l := s.Leases
		bad := spec("lt-bad")
		bad.PIDs = 0
		if err := l.Create(ctx, bad); !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("create with pids 0: %v, want lease.ErrInvalid", err)
		}
		if listed(t, ctx, l, "lt-bad") {
			t.Error("a refused spec made a lease")
		}
		for _, id := range []string{"../x", "", "a/b"} {
			if err := l.Create(ctx, spec(id)); err == nil {
				t.Errorf("create %q: nil, want an error", id)
			}
			if err := l.Remove(ctx, id); err == nil {
				t.Errorf("remove %q: nil, want an error", id)
			}
			if err := l.Kill(ctx, id); err == nil {
				t.Errorf("kill %q: nil, want an error", id)
			}
			if ok, _ := l.CheckGone(ctx, id); ok {
				t.Errorf("check gone %q: ok, want not proven", id)
			}
			if d, p := l.Dir(id), l.CgroupsPath(id); d != "" || p != "" {
				t.Errorf("dir, cgroupsPath of %q = %q, %q; want none", id, d, p)
			}
		}
	}},
	{"cpu.max changes on a lease, is refused out of range and on none", func(t *testing.T, ctx context.Context, s Subject) {
		l := s.Leases
		create(t, ctx, l, "lt-cpu")
		if err := l.SetCPUMax(ctx, "lt-cpu", 100); err != nil {
			t.Errorf("set cpu.max: %v", err)
		}
		if err := l.SetCPUMax(ctx, "lt-cpu", 0); !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("set cpu.max 0: %v, want lease.ErrInvalid", err)
		}
		if err := l.SetCPUMax(ctx, "lt-none", 100); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("set cpu.max of no lease: %v, want fs.ErrNotExist", err)
		}
	}},
	{"a populated lease resizes live, is refused invalid and on none", func(t *testing.T, ctx context.Context, s Subject) {
		l := s.Leases
		create(t, ctx, l, "lt-resize")
		s.Populate(t, "lt-resize")
		if err := l.Resize(ctx, lease.Spec{ID: "lt-resize", CPUMillis: 500, MemoryBytes: 128 << 20, PIDs: 100}); err != nil {
			t.Errorf("resize: %v", err)
		}
		if pop, err := l.Populated(ctx, "lt-resize"); err != nil || !pop {
			t.Errorf("populated after resize = %v, %v; want its process kept", pop, err)
		}
		if err := l.Resize(ctx, lease.Spec{ID: "lt-resize", CPUMillis: 0, MemoryBytes: 128 << 20, PIDs: 100}); !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("resize to cpu 0: %v, want lease.ErrInvalid", err)
		}
		if err := l.Resize(ctx, spec("lt-none")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("resize of no lease: %v, want fs.ErrNotExist", err)
		}
	}},
	{"remove is idempotent and proven gone", func(t *testing.T, ctx context.Context, s Subject) {
		l := s.Leases
		create(t, ctx, l, "lt-rm")
		for i := range 2 {
			if err := l.Remove(ctx, "lt-rm"); err != nil {
				t.Fatalf("remove %d: %v", i+1, err)
			}
		}
		if ok, detail := l.CheckGone(ctx, "lt-rm"); !ok || !strings.Contains(detail, "absent") {
			t.Errorf("check gone = %v %q; want gone, saying absent", ok, detail)
		}
		if listed(t, ctx, l, "lt-rm") {
			t.Error("a removed lease is listed")
		}
		if err := l.Kill(ctx, "lt-rm"); err != nil {
			t.Errorf("kill of no lease: %v, want nil", err)
		}
		if pop, err := l.Populated(ctx, "lt-rm"); err != nil || pop {
			t.Errorf("populated of no lease = %v, %v; want false, nil", pop, err)
		}
		if _, err := l.Stats(ctx, "lt-rm"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("stats of no lease: %v, want fs.ErrNotExist", err)
		}
	}},
	{"kill empties a populated lease and keeps it", func(t *testing.T, ctx context.Context, s Subject) {
		l := s.Leases
		create(t, ctx, l, "lt-kill")
		s.Populate(t, "lt-kill")
		if pop, err := l.Populated(ctx, "lt-kill"); err != nil || !pop {
			t.Fatalf("populated = %v, %v; want true", pop, err)
		}
		if st, err := l.Stats(ctx, "lt-kill"); err != nil || st.Procs == 0 {
			t.Errorf("stats = %+v, %v; want processes", st, err)
		}
		if ok, detail := l.CheckGone(ctx, "lt-kill"); ok || !strings.Contains(detail, "populated=true") {
			t.Errorf("check gone = %v %q; want not gone, populated", ok, detail)
		}
		if err := l.Kill(ctx, "lt-kill"); err != nil {
			t.Fatalf("kill: %v", err)
		}
		if pop, err := l.Populated(ctx, "lt-kill"); err != nil || pop {
			t.Errorf("populated after kill = %v, %v; want false", pop, err)
		}
		if !listed(t, ctx, l, "lt-kill") {
			t.Error("kill removed the lease")
		}
	}},
	{"remove kills a populated lease first", func(t *testing.T, ctx context.Context, s Subject) {
		l := s.Leases
		create(t, ctx, l, "lt-rmpop")
		s.Populate(t, "lt-rmpop")
		if err := l.Remove(ctx, "lt-rmpop"); err != nil {
			t.Fatalf("remove: %v", err)
		}
		if ok, detail := l.CheckGone(ctx, "lt-rmpop"); !ok {
			t.Errorf("check gone after removing a populated lease: %q", detail)
		}
	}},
}
