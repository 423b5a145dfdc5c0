package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/pgtest"
)

// TestServeFleetRefusesWhatItCannotDo: under `serve --fleet` a create
// with an idle timeout is refused (503 unavailable,
// naming the missing feature) instead of being accepted and silently not
// done; nothing is placed, and a plain create still works.
func TestServeFleetRefusesWhatItCannotDo(t *testing.T) {
	srv := pgtest.Start(t)
	f := newFleetEnv(t, srv, []string{"node-a"}, "--max-sandboxes", "4", "--poll", "200ms")
	e := f.env
	key := strings.TrimSpace(e.ok("key", "create", "--owner", "team-a"))
	e.ok("owner", "quota", "set", "team-a", "--sandboxes", "100", "--cpu", "100", "--memory", "100Gi", "--creates-per-min", "100000")
	e.socket = "/nonexistent/ctld.sock"
	args := append([]string{"--fleet", "--template", "busybox", "--default-timeout", "0", "--lease-ttl", "1s"}, channelArgs(f.ca.Issue(t, "manager", false))...)
	a := e.startServeChild("127.0.0.1:0", args...)
	c := &client.Client{BaseURL: "http://" + a.addr, Key: key}
	defer func() {
		if t.Failed() {
			t.Logf("replica:\n%s\n%s", a.stderr(), f.logs())
		}
	}()
	ctx := context.Background()
	for _, tc := range []struct {
		req  client.CreateRequest
		want string
	}{
		{client.CreateRequest{Template: "busybox", IdleTimeoutSec: 60}, "idle_timeout_sec is not available in fleet mode"},
	} {
		var ce *client.Error
		_, err := c.Create(ctx, tc.req)
		if !errors.As(err, &ce) || ce.Code != client.CodeUnavailable || !strings.Contains(ce.Message, tc.want) {
			t.Fatalf("create %+v under --fleet: %v, want unavailable: %s", tc.req, err, tc.want)
		}
	}
	if l, err := c.List(ctx, client.ListOptions{}); err != nil || len(l.Sandboxes) != 0 {
		t.Fatalf("sandboxes after refused creates: %+v, %v; want none", l, err)
	}
	sb, err := c.Create(ctx, client.CreateRequest{Template: "busybox", OnExit: client.OnExitKeep})
	if err != nil || sb.State != client.StateReady {
		t.Fatalf("plain create under --fleet: %+v, %v", sb, err)
	}
}
