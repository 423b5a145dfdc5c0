package metrics

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

type fakeWriters struct {
	ws  []WriterCounts
	err error
}

func (f *fakeWriters) WriterCounts(context.Context) ([]WriterCounts, error) { return f.ws, f.err }

// TestNBDErrors: ctld_nbd_errors_total adds what each writer counted
// since the last scrape: a writer read twice counts its growth once, a
// restarted writer (another pid) counts from zero, a writer that did not
// answer keeps its last counts (nothing counted twice when it answers
// again), a gone writer is forgotten; the totals outlive a term.
func TestNBDErrors(t *testing.T) {
	m, _ := newTest(t)
	src := &fakeWriters{}
	remove, err := m.ServeWriters(src)
	if err != nil {
		t.Fatal(err)
	}
	w := func(dir, writer string, counts map[string]uint64) WriterCounts {
		return WriterCounts{Dir: dir, Writer: writer, Counts: counts}
	}
	steps := []struct {
		name         string
		ws           []WriterCounts
		read, write  float64
		conn, unread float64
		reconnect    float64
	}{
		{"first scrape", []WriterCounts{w("/w/a", "pid 10 epoch 1", map[string]uint64{"read": 2, "connection": 1})}, 2, 0, 1, 0, 0},
		{"grown, and a second writer", []WriterCounts{
			w("/w/a", "pid 10 epoch 1", map[string]uint64{"read": 5, "connection": 1}),
			w("/w/b", "pid 11 epoch 4", map[string]uint64{"write": 1, "reconnect": 2}),
		}, 5, 1, 1, 0, 2},
		{"a unread, b gone", []WriterCounts{{Dir: "/w/a", Err: errors.New("writer stats of /w/a: deadline exceeded")}}, 5, 1, 1, 1, 2},
		{"a answers again", []WriterCounts{w("/w/a", "pid 10 epoch 1", map[string]uint64{"read": 6, "connection": 1})}, 6, 1, 1, 0, 2},
		{"a restarted", []WriterCounts{w("/w/a", "pid 12 epoch 2", map[string]uint64{"read": 1})}, 7, 1, 1, 0, 2},
		{"b back as a new writer", []WriterCounts{
			w("/w/a", "pid 12 epoch 2", map[string]uint64{"read": 1}),
			w("/w/b", "pid 13 epoch 5", map[string]uint64{"write": 1}),
		}, 7, 2, 1, 0, 2},
	}
	for _, s := range steps {
		src.ws = s.ws
		got := []float64{seriesValue(t, m, "ctld_nbd_errors_total", "read"), seriesValue(t, m, "ctld_nbd_errors_total", "write"),
			seriesValue(t, m, "ctld_nbd_errors_total", "connection"), gaugeNoLabel(t, m, "ctld_writers_unread"),
			seriesValue(t, m, "ctld_nbd_errors_total", "reconnect")}
		want := []float64{s.read, s.write, s.conn, s.unread, s.reconnect}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s: read, write, connection, unread, reconnect = %v, want %v", s.name, got, want)
			}
		}
		// Each scrape above gathered once per value read: the counts
		// did not move between them (read twice, counted once).
	}
	if c := testutil.CollectAndCount(m.Registry, "ctld_nbd_errors_total"); c != len(NBDErrorKinds) {
		t.Errorf("%d series, want one per kind (%d)", c, len(NBDErrorKinds))
	}
	// The writers cannot be listed: the scrape says so, the totals stay.
	src.err = errors.New("list writers: permission denied")
	if _, err := m.Registry.Gather(); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("gather with unlistable writers: %v", err)
	}
	remove()
	if c := testutil.CollectAndCount(m.Registry, "ctld_nbd_errors_total"); c != 0 {
		t.Errorf("after the term: %d series", c)
	}
	src.err = nil
	if _, err := m.ServeWriters(src); err != nil {
		t.Fatal(err)
	}
	if v := seriesValue(t, m, "ctld_nbd_errors_total", "read"); v != 7 {
		t.Errorf("next term: read %v, want the process's 7", v)
	}
}

func gaugeNoLabel(t *testing.T, m *Metrics, name string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}
