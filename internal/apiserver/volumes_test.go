package apiserver

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// TestVolumeRoutes: the block volume calls reach the Service with what the
// client sent, and malformed ones get a clear 400 without reaching it.
func TestVolumeRoutes(t *testing.T) {
	fake := &fakeService{}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
	c := &api.Client{SocketPath: srv.sock}
	ctx := t.Context()
	if _, err := c.Pause(ctx, "sb-1", api.PauseRequest{OperationID: "op-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Snapshot(ctx, "sb-1", api.SnapshotRequest{Name: "before-upgrade"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Volume(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fork(ctx, "sb-2", api.ForkRequest{Source: "sb-1", Snapshot: "before-upgrade"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Restore(ctx, "sb-1", api.RestoreRequest{Snapshot: "before-upgrade"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"Pause sb-1 op-1", "Snapshot sb-1 before-upgrade", "Volume sb-1", "Fork sb-2 from sb-1 before-upgrade", "Restore sb-1 to before-upgrade"}
	if calls := fake.Calls(); !reflect.DeepEqual(calls, want) {
		t.Fatalf("calls:\n%q\nwant\n%q", calls, want)
	}

	bad := &fakeService{}
	srv = startServer(t, &Server{Service: bad, AllowedGID: -1})
	jsonCT := map[string]string{"Content-Type": "application/json"}
	cases := []struct{ name, target, body, msg string }{
		{"pause no op", "/v1/sandboxes/sb-1/pause", `{}`, "operation_id"},
		{"snapshot no name", "/v1/sandboxes/sb-1/snapshot", `{}`, "snapshot name is empty"},
		{"snapshot bad name", "/v1/sandboxes/sb-1/snapshot", `{"name":"../x"}`, "invalid snapshot name"},
		{"fork no source", "/v1/sandboxes/sb-2/fork", `{}`, "source sandbox id is empty"},
		{"fork bad snapshot", "/v1/sandboxes/sb-2/fork", `{"source":"sb-1","snapshot":"A B"}`, "invalid snapshot name"},
		{"restore unknown field", "/v1/sandboxes/sb-1/restore", `{"snapshot":"s","gen":1}`, `unknown field "gen"`},
	}
	for _, tc := range cases {
		resp := rawDo(t, srv.sock, "POST", tc.target, jsonCT, []byte(tc.body))
		var eb api.ErrorBody
		if err := json.Unmarshal(resp.body, &eb); err != nil || resp.status != 400 || eb.Code != errdefs.CodeInvalidArgument || !strings.Contains(eb.Message, tc.msg) {
			t.Errorf("%s: %d %s, want 400 invalid_argument containing %q", tc.name, resp.status, resp.body, tc.msg)
		}
	}
	if calls := bad.Calls(); len(calls) != 0 {
		t.Errorf("the Service saw %q", calls)
	}
}
