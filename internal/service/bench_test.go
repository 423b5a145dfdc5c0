package service

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
)

// TestServiceOverheadFakeNode measures, over the fake node (so only the
// service's own cost shows: HTTP, auth, quota transaction, store), create
// through the API vs Manager.Create, and exec through the API vs ctld's
// socket, p50 of n each. It asserts nothing about the ratio (the issue's
// ratios are against a real ctld in the VM); it logs the numbers.
func TestServiceOverheadFakeNode(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	if _, err := e.store.SetQuota(ctx, "team-a", quotaOf(1000)); err != nil {
		t.Fatal(err)
	}
	c := &client.Client{BaseURL: e.url, Key: e.keyA, HTTP: &http.Client{Transport: &http.Transport{}}}
	m := e.srv.Manager
	const n = 50
	p50 := func(f func(i int) error) time.Duration {
		var ds []time.Duration
		for i := range n {
			start := time.Now()
			if err := f(i); err != nil {
				t.Fatal(err)
			}
			ds = append(ds, time.Since(start))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[n/2]
	}
	var ids []string
	api1 := p50(func(int) error {
		sb, err := c.Create(ctx, client.CreateRequest{Template: "busybox"})
		ids = append(ids, sb.ID)
		return err
	})
	direct := p50(func(i int) error {
		_, err := m.Create(ctx, fmt.Sprintf("direct-%d", i), manager.Spec{Resources: api.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PIDs: 256},
			RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"}})
		return err
	})
	node := &api.Client{SocketPath: e.socket}
	execAPI := p50(func(int) error {
		_, err := c.Exec(ctx, ids[0], client.ExecRequest{Args: []string{"echo", "hi"}})
		return err
	})
	execNode := p50(func(int) error {
		var out bytes.Buffer
		_, err := node.ExecStream(ctx, ids[0], api.ExecRequest{Args: []string{"echo", "hi"}}, &out, &out)
		return err
	})
	t.Logf("fake node, p50 of %d: create via API %v vs Manager.Create %v (+%v); exec via API %v vs ctld socket %v (+%v)",
		n, api1, direct, api1-direct, execAPI, execNode, execAPI-execNode)
}
