package exitwatch

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/journal"
)

// TestReadReportHostileDir: the report's directory is the guest's, so
// every shape a hostile guest can leave there is refused with an error,
// quickly, without following a link, blocking on a FIFO, or reading more
// than the bound; Classify then says crash and names the bad report.
func TestReadReportHostileDir(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte(`{"code":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		make func(p string) error
		want string
	}{
		{"symlink to a host file", func(p string) error { return os.Symlink(secret, p) }, "too many levels"},
		{"fifo", func(p string) error { return unix.Mkfifo(p, 0o600) }, "not a regular file"},
		{"directory", func(p string) error { return os.Mkdir(p, 0o700) }, "not a regular file"},
		{"oversized", func(p string) error {
			return os.WriteFile(p, []byte(`{"code":1}`+strings.Repeat(" ", 1<<20)), 0o600)
		}, "over 256 bytes"},
		{"unknown field", func(p string) error { return os.WriteFile(p, []byte(`{"code":1,"x":2}`), 0o600) }, "unknown field"},
		{"code out of range", func(p string) error { return os.WriteFile(p, []byte(`{"code":4096}`), 0o600) }, "out of 0..255"},
		{"negative code", func(p string) error { return os.WriteFile(p, []byte(`{"code":-5}`), 0o600) }, "out of 0..255"},
		{"empty", func(p string) error { return os.WriteFile(p, nil, 0o600) }, "decode"},
	} {
		dir := t.TempDir()
		if err := c.make(filepath.Join(dir, wire.ExitReportName)); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, found, err := ReadReport(dir)
		if found || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: found %v err %v, want an error with %q", c.name, found, err, c.want)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s: took %v", c.name, d)
		}
		e := Classify(Facts{ReportErr: err})
		if e.Kind != journal.ExitCrash || e.Code != -1 || !strings.Contains(e.Detail, "bad exit report") {
			t.Errorf("%s: classified %+v, want a crash naming the bad report", c.name, e)
		}
	}
	r, found, err := ReadReport(t.TempDir())
	if found || err != nil || r.Code != 0 {
		t.Errorf("no report: %+v %v %v", r, found, err)
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		f    Facts
		kind journal.ExitKind
		code int
	}{
		{Facts{Report: wire.ExitReport{Code: 7}, ReportFound: true}, journal.ExitNormal, 7},
		{Facts{Report: wire.ExitReport{Code: 137}, ReportFound: true, OOMKills: 1}, journal.ExitNormal, 137},
		{Facts{OOMKills: 2}, journal.ExitOOM, -1},
		{Facts{}, journal.ExitCrash, -1},
	} {
		if e := Classify(c.f); e.Kind != c.kind || e.Code != c.code {
			t.Errorf("%+v: %+v, want %s %d", c.f, e, c.kind, c.code)
		}
	}
}

type probe struct {
	mu  sync.Mutex
	pop map[string]bool
}

func (p *probe) Populated(_ context.Context, id string) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pop[id], nil
}

// TestWatcherWakesOnNotification: with a fallback interval of an hour,
// a modification of the watched events file (as the kernel notifies a
// cgroup.events change) makes the watcher look at once; gone runs once;
// an unpopulated lease fires as soon as it is armed; Stop disarms.
func TestWatcherWakesOnNotification(t *testing.T) {
	dir := t.TempDir()
	ev := filepath.Join(dir, "cgroup.events")
	if err := os.WriteFile(ev, []byte("populated 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &probe{pop: map[string]bool{"a": true, "c": true}}
	ended := func(id string) Ended {
		return func(ctx context.Context) (bool, error) {
			pop, err := p.Populated(ctx, id)
			return !pop, err
		}
	}
	w := New(time.Hour, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	fired := make(chan string, 4)
	w.Watch(ctx, "a", []string{ev}, ended("a"), func() { fired <- "a" })
	w.Watch(ctx, "b", nil, ended("b"), func() { fired <- "b" }) // gone already
	w.Watch(ctx, "c", nil, ended("c"), func() { fired <- "c" })
	if got := <-fired; got != "b" {
		t.Fatalf("fired %s first, want b (unpopulated when armed)", got)
	}
	w.Stop("c")
	p.mu.Lock()
	p.pop["a"], p.pop["c"] = false, false
	p.mu.Unlock()
	start := time.Now()
	if err := os.WriteFile(ev, []byte("populated 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-fired:
		if got != "a" {
			t.Fatalf("fired %s, want a", got)
		}
		t.Logf("woken %v after the notification", time.Since(start))
	case <-time.After(5 * time.Second):
		t.Fatal("no wake on the events file's modification")
	}
	os.WriteFile(ev, []byte("populated 0\n"), 0o600)
	select {
	case got := <-fired:
		t.Fatalf("%s fired again (or after Stop)", got)
	case <-time.After(200 * time.Millisecond):
	}
	if left := w.Watched(); len(left) != 0 {
		t.Errorf("still watched: %v", left)
	}
	// A file renamed into a watched directory (the agent's report) wakes
	// the watch too.
	dir = t.TempDir()
	reported := false
	w.Watch(ctx, "d", []string{dir}, func(context.Context) (bool, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return reported, nil
	}, func() { fired <- "d" })
	p.mu.Lock()
	reported = true
	p.mu.Unlock()
	tmp := filepath.Join(dir, ".exit.tmp")
	os.WriteFile(tmp, []byte("{}"), 0o600)
	os.Rename(tmp, filepath.Join(dir, wire.ExitReportName))
	select {
	case got := <-fired:
		if got != "d" {
			t.Fatalf("fired %s, want d", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no wake on a file renamed into the watched dir")
	}
}
