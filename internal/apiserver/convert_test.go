package apiserver

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node"
	"github.com/ctld/ctld/internal/node/warm"
	"github.com/ctld/ctld/internal/proof"
)

// zeroFields lists the fields of v (recursively through structs, pointers
// and the first element of slices) that are zero.
func zeroFields(v reflect.Value, path string) []string {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return []string{path}
		}
		return zeroFields(v.Elem(), path)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			if v.IsZero() {
				return []string{path}
			}
			return nil
		}
		var out []string
		for i := range v.NumField() {
			out = append(out, zeroFields(v.Field(i), path+"."+v.Type().Field(i).Name)...)
		}
		return out
	case reflect.Slice:
		if v.Len() == 0 {
			return []string{path}
		}
		return zeroFields(v.Index(0), path+"[0]")
	}
	if v.IsZero() {
		return []string{path}
	}
	return nil
}

func fullRecord() journal.Sandbox {
	at := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	steps := []journal.StepTiming{{Resource: "cgroup", MakeMS: 1, RemoveMS: 2, CheckMS: 3}}
	return journal.Sandbox{
		ID: "sb", Generation: 2, State: journal.StateReady, ContainerID: "sb-g2", LeaseID: "sb-g2",
		Resources: journal.Resources{CPUMillis: 1, MemoryBytes: 2, PIDs: 3, Cpuset: "0", DiskBytes: 4},
		RootFS:    journal.RootFS{Mode: "overlay", Template: "busybox", ExpectHead: journal.VolumeHead{Seq: 4, Generation: 5, WriterEpoch: 6, Node: "m"}, WriterEpoch: 7}, Epoch: 3, CreatedAt: at,
		Timings:        journal.Timings{AdmitMS: 1, LeaseMS: 2, RootFSMS: 3, NetworkMS: 4, RunscMS: 5, ProofMS: 6, TotalMS: 7, Steps: steps},
		ReleaseTimings: &journal.ReleaseTimings{Steps: steps, ProofMS: 1, TotalMS: 2},
		Reason:         "r", OOMKills: 1,
		Block:   &journal.BlockDevice{WriterEpoch: 5, Dir: "/w/sb-g2", Template: "busybox", Index: 3, PID: 42, Size: 64 << 20, Restarts: 1, BaseVolume: "templates/busybox"},
		Request: &journal.ClaimRequest{Volumes: []journal.VolumeMount{{ID: "data", Path: "/data", ExpectHead: journal.VolumeHead{Seq: 4, Generation: 5, WriterEpoch: 6, Node: "m"}}}},
		Volumes: []journal.AttachedVolume{{ID: "data", Head: journal.VolumeHead{Seq: 4, Generation: 5, WriterEpoch: 6, Node: "n"}}},
		Seal:    &journal.SealRecord{State: journal.SealAbandoned, OperationID: "p1", Generation: 3, Head: journal.VolumeHead{Seq: 1, Generation: 3, WriterEpoch: 5, Node: "n"}, Error: "fenced"},
		Exit:    &journal.ExitRecord{Kind: journal.ExitNormal, Code: 7, At: at, SeenBy: 4, OOMKills: 1, Detail: "d"},
		ProofOp: "exit-sb-g2",
	}
}

// The wire sandbox gets every field of the record it shows: a field added
// to api.Sandbox (or one of its parts) without a conversion fails here.
func TestAPISandboxCarriesEveryField(t *testing.T) {
	got := apiSandbox(fullRecord())
	// Network is live, not of the record: view fills it from the firewall's
	// counters.
	got.Network = &api.NetworkStatus{Mode: api.NetworkOpen, TxBytes: 1, TxPackets: 1, DroppedPackets: 1}
	// Usage is live too: view converts the meter's totals, every field.
	u := journal.Usage{CPUUsec: 1, MemoryCurrentBytes: 2, MemoryPeakBytes: 3, PIDsPeak: 4, IOReadBytes: 5, IOWriteBytes: 6,
		DiskUsedBytes: 7, TxBytes: 8, TxPackets: 9, DroppedPackets: 10, WallMS: 11}
	got.Usage = apiView(node.SandboxView{Sandbox: fullRecord(), Usage: &u}).Usage
	if z := zeroFields(reflect.ValueOf(got), "api.Sandbox"); len(z) != 0 {
		t.Fatalf("apiSandbox leaves fields zero: %v", z)
	}
	if got.State != api.StateReady || got.RootFS.Mode != api.RootFSOverlay || got.Timings.Steps[0] != (api.StepTiming{Resource: "cgroup", MakeMS: 1, RemoveMS: 2, CheckMS: 3}) {
		t.Fatalf("apiSandbox = %+v", got)
	}
	// Without a teardown there are no release timings, not empty ones.
	rec := fullRecord()
	rec.ReleaseTimings, rec.Timings.Steps = nil, nil
	if got := apiSandbox(rec); got.ReleaseTimings != nil || got.Timings.Steps != nil {
		t.Fatalf("apiSandbox invented timings: %+v", got)
	}
}

// The journal keeps every field of an admitted claim, and owns its copy.
func TestClaimRecordCarriesEveryField(t *testing.T) {
	req := api.ClaimRequest{
		OperationID: "op", Generation: 2, RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox", ExpectHead: api.VolumeHead{Seq: 4, Generation: 5, WriterEpoch: 6, Node: "m"}, WriterEpoch: 7},
		Resources: api.Resources{CPUMillis: 1, MemoryBytes: 2, PIDs: 3, Cpuset: "0", DiskBytes: 4},
		Network: api.NetworkPolicy{Mode: api.NetworkRestrict, Rules: []api.NetworkRule{
			{CIDR: "203.0.113.0/24", Domain: "example.com", Protocol: "tcp", Ports: []string{"443"}},
		}},
		Process: api.Process{Args: []string{"/bin/sh"}, Env: []string{"A=1"}, Cwd: "/", UID: 1, GID: 2, UserSet: true}, MaxLifetimeSec: 60, OnExit: api.OnExitRelease,
		// Head is the node's answer (a claim with it is invalid): set
		// only so every field of the request is seen.
		Volumes: []api.VolumeMount{{ID: "data", Path: "/data", ExpectHead: api.VolumeHead{Seq: 4, Generation: 5, WriterEpoch: 6, Node: "m"}, Head: &api.VolumeHead{Seq: 1, Generation: 1, WriterEpoch: 1, Node: "n"}}},
	}
	if z := zeroFields(reflect.ValueOf(req), "api.ClaimRequest"); len(z) != 0 {
		t.Fatalf("test request leaves fields zero: %v", z)
	}
	rec := claimRecord(req)
	if z := zeroFields(reflect.ValueOf(rec), "journal.ClaimRequest"); len(z) != 0 {
		t.Fatalf("claimRecord leaves fields zero: %v", z)
	}
	req.Process.Args[0], req.Volumes[0].ID = "changed", "changed"
	if rec.Process.Args[0] != "/bin/sh" || rec.Volumes[0].ID != "data" {
		t.Fatal("claimRecord shares the request's slices")
	}
}

// A valid claim's domain form encodes exactly like the wire request: the
// node hashes the JSON of the request it takes (requestHash), and the
// hashes of operations journaled before the adapter existed, when the node
// hashed api.ClaimRequest, must still match a repeat of the same claim.
func TestClaimRecordEncodesLikeTheWire(t *testing.T) {
	full := api.ClaimRequest{
		OperationID: "op", Generation: 2, RootFS: api.RootFS{Mode: api.RootFSBlock, Template: "busybox", ExpectHead: api.VolumeHead{Seq: 4, Generation: 5, WriterEpoch: 6, Node: "m"}, WriterEpoch: 7},
		Resources: api.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 3, Cpuset: "0-1", DiskBytes: 4 << 20},
		Network: api.NetworkPolicy{Mode: api.NetworkRestrict, Rules: []api.NetworkRule{
			{CIDR: "203.0.113.0/24", Protocol: "tcp", Ports: []string{"443", "8000-8100"}}, {Domain: "*.example.com"},
		}},
		Process: api.Process{Args: []string{"/bin/sh", "-c", "x"}, Env: []string{"A=1"}, Cwd: "/w", UID: 1, GID: 2}, MaxLifetimeSec: 60,
		Volumes: []api.VolumeMount{{ID: "data", Path: "/data", ExpectHead: api.VolumeHead{Seq: 1, Node: "n"}}, {ID: "logs", Path: "/logs"}},
	}
	minimal := api.ClaimRequest{OperationID: "op2", Generation: 1, RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"},
		Resources: api.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 1}}
	empty := minimal
	empty.Network.Rules, empty.Process.Args, empty.Process.Env, empty.Volumes = []api.NetworkRule{}, []string{}, []string{}, []api.VolumeMount{}
	for name, req := range map[string]api.ClaimRequest{"every field": full, "the least": minimal, "empty lists": empty} {
		if err := req.Validate(); err != nil {
			t.Fatalf("%s: the test claim is invalid: %v", name, err)
		}
		wire, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		dom, err := json.Marshal(claimRecord(req))
		if err != nil {
			t.Fatal(err)
		}
		if string(wire) != string(dom) {
			t.Errorf("%s: the node's request encodes as\n%s\nthe wire's as\n%s", name, dom, wire)
		}
	}
}

// The wire node gets every field of the node's info: a field added to
// api.Node (or one of its parts) without a conversion fails here.
func TestAPINodeCarriesEveryField(t *testing.T) {
	at := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	c := node.Capacity{CPUMillis: 1, MemoryBytes: 2, PIDs: 3, NBDDevices: 4, Addresses: 5, DiskBytes: 6}
	got := apiNode(node.Info{
		NodeID: "n", BootID: "b", Slot: "a", Epoch: 7, NodeKey: []byte{1},
		Rotation: &proof.Rotation{NodeID: "n", OldKey: []byte{1}, NewKey: []byte{2}, IssuedAt: at, OldSignature: []byte{3}, NewSignature: []byte{4}, Version: 1},
		Versions: node.Versions{Ctld: "c", Kernel: "k", Runsc: "r", Nft: "f"},
		Capacity: node.Ledger{Total: c, Allocatable: c, Leased: c, Warm: c, Withheld: c},
		Withheld: []node.Withheld{{SandboxID: "sb", Generation: 2, Reason: "r", Resources: c, FailedChecks: []proof.Check{{Name: "x", Detail: "d"}},
			ProofOperationID: "op", RetryAttempts: 1, LastAttempt: at, NextAttempt: at}},
		WarmPools: map[string]warm.Stats{"z": {Idle: 1, Booting: 2, Hits: 3, Misses: 4}, "a": {Idle: 5, Booting: 6, Hits: 7, Misses: 8}},
	})
	// The pools by template, in order (a map has none).
	if want := []api.WarmPool{{Template: "a", Idle: 5, Booting: 6, Hits: 7, Misses: 8}, {Template: "z", Idle: 1, Booting: 2, Hits: 3, Misses: 4}}; !reflect.DeepEqual(got.WarmPools, want) {
		t.Fatalf("warm pools %+v, want %+v", got.WarmPools, want)
	}
	// A failed check is not OK: the one field that is false by design.
	got.Withheld[0].FailedChecks[0].OK = true
	if z := zeroFields(reflect.ValueOf(got), "api.Node"); len(z) != 0 {
		t.Fatalf("apiNode leaves fields zero: %v", z)
	}
	if got.Role != api.RolePrimary {
		t.Fatalf("role %q", got.Role)
	}
}

// The node's release and pause requests encode like the wire's, as the
// claim does: the node hashes them into the operation's request hash.
func TestReleaseAndPauseEncodeLikeTheWire(t *testing.T) {
	for _, c := range []struct{ wire, dom any }{
		{api.ReleaseRequest{OperationID: "r1", Generation: 3}, node.ReleaseRequest{OperationID: "r1", Generation: 3}},
		{api.ReleaseRequest{OperationID: "r1"}, node.ReleaseRequest{OperationID: "r1"}},
		{api.PauseRequest{OperationID: "p1", Generation: 3}, node.PauseRequest{OperationID: "p1", Generation: 3}},
		{api.PauseRequest{OperationID: "p1"}, node.PauseRequest{OperationID: "p1"}},
	} {
		w, err := json.Marshal(c.wire)
		if err != nil {
			t.Fatal(err)
		}
		d, err := json.Marshal(c.dom)
		if err != nil {
			t.Fatal(err)
		}
		if string(w) != string(d) {
			t.Errorf("%T encodes as %s, the wire's %T as %s", c.dom, d, c.wire, w)
		}
	}
}
