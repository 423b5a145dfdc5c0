package main

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ha"
	"github.com/ctld/ctld/internal/testutil"
)

// An instance that accepts but never answers must not hide the other one,
// and status says what it waited for.
func TestStatusBoundsEachSlot(t *testing.T) {
	g := globalOpts{stateDir: t.TempDir(), runDir: t.TempDir()}
	for _, slot := range []string{"a", "b"} {
		testutil.MuteListener(t, probePath(g.runDir, slot))
	}
	t0 := time.Now()
	r := ctld(t, "--state-dir", g.stateDir, "--run-dir", g.runDir, "status")
	if r.code != exitOK {
		t.Fatalf("status: exit %d, stderr %q", r.code, r.stderr)
	}
	if d := time.Since(t0); d > 3*probeTimeout {
		t.Fatalf("status took %s for two mute slots", d)
	}
	for _, slot := range []string{"a", "b"} {
		want := "ctld@" + slot + "  down     (no answer on " + filepath.Join(g.runDir, "ctld-"+slot+".sock") + " within 2s"
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status output lacks %q:\n%s", want, r.stdout)
		}
	}
}

// With a primary, status shows its warm pools from GET /v1/node (one line
// per pool with the hit rate; JSON under "warm"); without an answer on
// the API socket it says so.
func TestStatusShowsWarmPools(t *testing.T) {
	g := globalOpts{stateDir: t.TempDir(), runDir: t.TempDir()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pl, err := ha.ListenUnix(probePath(g.runDir, "a"), 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = ha.ServeProbe(ctx, pl, func() ha.Status { return ha.Status{Slot: "a", Role: ha.RolePrimary, Epoch: 3, Health: "ok"} }, nil)
	}()
	r := ctld(t, "--state-dir", g.stateDir, "--run-dir", g.runDir, "status")
	if want := "warm pools: no answer on " + apiSocketPath(g.runDir); r.code != exitOK || !strings.Contains(r.stdout, want) {
		t.Fatalf("status with no API socket: exit %d\n%s\nwant %q", r.code, r.stdout, want)
	}

	al, err := ha.ListenUnix(apiSocketPath(g.runDir), 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/node" {
			http.NotFound(w, req)
			return
		}
		_ = json.NewEncoder(w).Encode(api.Node{Slot: "a", WarmPools: []api.WarmPool{
			{Template: "busybox", Idle: 2, Booting: 1, Hits: 3, Misses: 1},
			{Template: "other"},
		}})
	})}
	go func() { _ = srv.Serve(al) }()
	defer srv.Close()
	r = ctld(t, "--state-dir", g.stateDir, "--run-dir", g.runDir, "status")
	for _, want := range []string{
		"warm pool busybox  idle 2  booting 1  hits 3  misses 1  hit rate 75%\n",
		"warm pool other  idle 0  booting 0  hits 0  misses 0  hit rate -\n",
	} {
		if r.code != exitOK || !strings.Contains(r.stdout, want) {
			t.Errorf("status: exit %d\n%s\nwant %q", r.code, r.stdout, want)
		}
	}
	r = ctld(t, "--state-dir", g.stateDir, "--run-dir", g.runDir, "status", "--json")
	var out struct {
		Warm statusWarm `json:"warm"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out.Warm.Pools) != 2 || out.Warm.Pools[0].Hits != 3 || out.Warm.Error != "" {
		t.Errorf("status --json: %v\n%s", err, r.stdout)
	}
}
