// Package servicetest is the contract of an apiserver.Service: one set of
// tests that runs against the node (over the fake kernel, through the
// adapter: internal/apiserver's adapter_test.go) and against the
// manager's fake node (internal/manager/fakenode), so the fake the manager
// is tested with cannot drift from the node about idempotency,
// generations, kinds of error and the guest agent's calls.
package servicetest

import (
	"bytes"
	"context"
	"reflect"
	"slices"
	"testing"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/apiserver"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/proof"
)

// New returns a fresh, empty service for one test. Its claims of template
// "busybox" in overlay mode must succeed; its exec must know "echo".
type New func(t *testing.T) apiserver.Service

// Claim is a claim every implementation accepts.
func Claim(op string, gen uint64) api.ClaimRequest {
	return api.ClaimRequest{
		OperationID: op, Generation: gen,
		RootFS:    api.RootFS{Mode: "overlay", Template: "busybox"},
		Resources: api.Resources{CPUMillis: 200, MemoryBytes: 128 << 20, PIDs: 128, DiskBytes: 16 << 20},
	}
}

func release(op string, gen uint64) api.ReleaseRequest {
	return api.ReleaseRequest{OperationID: op, Generation: gen}
}

const id = "sb"

// Option names a part of the contract an implementation has built; Run
// runs its cases only when asked.
type Option int

const (
	// LiveNetwork: UpdateNetwork applies a policy to a ready generation.
	// (The node refuses every update until its network is wired; its own
	// test says so.)
	LiveNetwork Option = iota + 1
	// GuestAgent: sessions, exec via runsc and the file calls (stat,
	// list, mkdir, remove, rename, streamed read and write) are served.
	// Their commands are busybox's: cat, echo, true, false, tty, sleep
	// and sh -c 'exit N'.
	GuestAgent
)

// Run runs the contract against the services newService makes.
func Run(t *testing.T, newService New, opts ...Option) {
	for _, c := range cases {
		if c.needs != 0 && !slices.Contains(opts, c.needs) {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			c.run(t, &subject{t: t, s: newService(t), ctx: context.Background()})
		})
	}
}

type subject struct {
	t   *testing.T
	s   apiserver.Service
	ctx context.Context
}

func (s *subject) claim(req api.ClaimRequest) api.ClaimResponse {
	s.t.Helper()
	r, err := s.s.Claim(s.ctx, id, req)
	if err != nil {
		s.t.Fatalf("claim %s generation %d: %v", req.OperationID, req.Generation, err)
	}
	return r
}

func (s *subject) ready() {
	s.t.Helper()
	s.claim(Claim("c1", 1))
}

func (s *subject) release(req api.ReleaseRequest) api.ReleaseResponse {
	s.t.Helper()
	r, err := s.s.Release(s.ctx, id, req)
	if err != nil {
		s.t.Fatalf("release %s generation %d: %v", req.OperationID, req.Generation, err)
	}
	return r
}

// wantCode fails unless err is of kind code.
func (s *subject) wantCode(what string, err error, code errdefs.Code) {
	s.t.Helper()
	if got := errdefs.CodeOf(err); got != code {
		s.t.Errorf("%s: %v (kind %q), want kind %s", what, err, got, code)
	}
}

var cases = []struct {
	name  string
	needs Option
	run   func(t *testing.T, s *subject)
}{
	{"claim is idempotent by operation id", 0, func(t *testing.T, s *subject) {
		a := s.claim(Claim("c1", 1))
		b := s.claim(Claim("c1", 1))
		if !reflect.DeepEqual(a, b) {
			t.Errorf("a repeated claim answered differently:\n%+v\n%+v", a, b)
		}
		if a.Sandbox.ID != id || a.Sandbox.Generation != 1 || a.Sandbox.State != api.StateReady {
			t.Errorf("claim answered %+v, want %s generation 1 ready", a.Sandbox, id)
		}
	}},
	{"an operation id reused for another request conflicts", 0, func(t *testing.T, s *subject) {
		s.claim(Claim("c1", 1))
		_, err := s.s.Claim(s.ctx, id, Claim("c1", 2))
		s.wantCode("claim c1 again for generation 2", err, errdefs.CodeConflict)
		other := Claim("c1", 1)
		other.Resources.CPUMillis++
		_, err = s.s.Claim(s.ctx, id, other)
		s.wantCode("claim c1 again with other resources", err, errdefs.CodeConflict)
		s.release(release("r1", 1))
		_, err = s.s.Release(s.ctx, id, release("r1", 2))
		s.wantCode("release r1 again for another generation", err, errdefs.CodeConflict)
	}},
	{"a claim of a live sandbox conflicts", 0, func(t *testing.T, s *subject) {
		s.claim(Claim("c1", 1))
		_, err := s.s.Claim(s.ctx, id, Claim("c2", 2))
		s.wantCode("claim generation 2 while 1 is ready", err, errdefs.CodeConflict)
		if sb, err := s.s.Get(s.ctx, id); err != nil || sb.Generation != 1 || sb.State != api.StateReady {
			t.Errorf("after the refused claim: %+v %v, want generation 1 ready", sb, err)
		}
	}},
	{"only a newer generation follows a released one", 0, func(t *testing.T, s *subject) {
		s.claim(Claim("c2", 2))
		s.release(release("r2", 2))
		for _, gen := range []uint64{1, 2} {
			_, err := s.s.Claim(s.ctx, id, Claim("old", gen))
			s.wantCode("claim of a generation not newer than the released one", err, errdefs.CodeConflict)
		}
		if r := s.claim(Claim("c3", 3)); r.Sandbox.Generation != 3 {
			t.Errorf("claim of generation 3: %+v", r.Sandbox)
		}
	}},
	{"release is idempotent and its proof is stored", 0, func(t *testing.T, s *subject) {
		s.claim(Claim("c1", 1))
		a := s.release(release("r1", 1))
		b := s.release(release("r1", 1))
		if !reflect.DeepEqual(a, b) {
			t.Errorf("a repeated release answered differently:\n%+v\n%+v", a, b)
		}
		if a.Sandbox.State != api.StateReleased || !a.Proof.Clean || a.Proof.OperationID != "r1" || a.Proof.Generation != 1 {
			t.Errorf("release answered %+v", a)
		}
		p, err := s.s.Proof(s.ctx, "r1")
		if err != nil || !reflect.DeepEqual(p, a.Proof) {
			t.Errorf("proof of r1: %+v %v, want the release's %+v", p, err, a.Proof)
		}
		nd, err := s.s.Node(s.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := proof.Verify(p.Record(), nd.NodeKey); err != nil {
			t.Errorf("the proof does not verify with the node's key: %v", err)
		}
		_, err = s.s.Release(s.ctx, id, release("r2", 1))
		s.wantCode("a second release (new operation) of a released generation", err, errdefs.CodeConflict)
	}},
	{"release of generation 0 releases the current one", 0, func(t *testing.T, s *subject) {
		s.claim(Claim("c1", 1))
		if r := s.release(release("r1", 0)); r.Sandbox.Generation != 1 || r.Sandbox.State != api.StateReleased {
			t.Errorf("release of generation 0: %+v", r.Sandbox)
		}
	}},
	{"a release of another generation is fenced", 0, func(t *testing.T, s *subject) {
		s.claim(Claim("c2", 2))
		for _, gen := range []uint64{1, 3} {
			_, err := s.s.Release(s.ctx, id, release("r", gen))
			s.wantCode("release of another generation", err, errdefs.CodeFenced)
		}
		if sb, err := s.s.Get(s.ctx, id); err != nil || sb.State != api.StateReady {
			t.Errorf("after fenced releases: %+v %v, want ready", sb, err)
		}
	}},
	{"unknown sandboxes and operations are not found", 0, func(t *testing.T, s *subject) {
		_, err := s.s.Get(s.ctx, "nope")
		s.wantCode("get", err, errdefs.CodeNotFound)
		_, err = s.s.Release(s.ctx, "nope", release("r1", 1))
		s.wantCode("release", err, errdefs.CodeNotFound)
		_, err = s.s.Proof(s.ctx, "r1")
		s.wantCode("proof", err, errdefs.CodeNotFound)
		_, err = s.s.Exec(s.ctx, "nope", api.ExecRequest{Args: []string{"echo"}}, &bytes.Buffer{}, &bytes.Buffer{})
		s.wantCode("exec", err, errdefs.CodeNotFound)
		// A refused release is not remembered: the id is free for a
		// release that can happen.
		if _, err := s.s.Claim(s.ctx, "nope", Claim("c1", 1)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.s.Release(s.ctx, "nope", release("r1", 1)); err != nil {
			t.Errorf("release r1 after its refusal: %v", err)
		}
	}},
	{"the ledger holds a ready generation's resources until its release", 0, func(t *testing.T, s *subject) {
		req := Claim("c1", 1)
		s.claim(req)
		nd, err := s.s.Node(s.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if l := nd.Capacity.Leased; l.CPUMillis != req.Resources.CPUMillis || l.MemoryBytes != req.Resources.MemoryBytes || l.PIDs != req.Resources.PIDs {
			t.Errorf("leased while ready: %+v, want the claim's %+v", l, req.Resources)
		}
		s.release(release("r1", 1))
		nd, _ = s.s.Node(s.ctx)
		if nd.Capacity.Leased.CPUMillis != 0 || nd.Capacity.Leased.MemoryBytes != 0 || len(nd.Withheld) != 0 {
			t.Errorf("after a clean release: leased %+v, withheld %+v", nd.Capacity.Leased, nd.Withheld)
		}
	}},
	{"list, exec and files serve a ready generation only", 0, func(t *testing.T, s *subject) {
		s.claim(Claim("c1", 1))
		l, err := s.s.List(s.ctx)
		if err != nil || !slices.ContainsFunc(l.Sandboxes, func(sb api.Sandbox) bool { return sb.ID == id && sb.Generation == 1 }) {
			t.Errorf("list: %+v %v", l, err)
		}
		var out bytes.Buffer
		if code, err := s.s.Exec(s.ctx, id, api.ExecRequest{Args: []string{"echo", "hi"}}, &out, &out); err != nil || code != 0 || out.String() != "hi\n" {
			t.Errorf("exec echo hi: %d %q %v", code, out.String(), err)
		}
		if err := s.s.WriteFile(s.ctx, id, "/f", []byte("data")); err != nil {
			t.Fatalf("write file: %v", err)
		}
		if b, err := s.s.ReadFile(s.ctx, id, "/f", 1<<20); err != nil || string(b) != "data" {
			t.Errorf("read back: %q %v", b, err)
		}
		_, err = s.s.ReadFile(s.ctx, id, "/missing", 1<<20)
		s.wantCode("read of a missing file", err, errdefs.CodeNotFound)
		s.release(release("r1", 1))
		_, err = s.s.Exec(s.ctx, id, api.ExecRequest{Args: []string{"echo"}}, &out, &out)
		s.wantCode("exec in a released generation", err, errdefs.CodeConflict)
		_, err = s.s.ReadFile(s.ctx, id, "/f", 1<<20)
		s.wantCode("read from a released generation", err, errdefs.CodeConflict)
		err = s.s.WriteFile(s.ctx, id, "/f", nil)
		s.wantCode("write to a released generation", err, errdefs.CodeConflict)
	}},
	{"a network update of an unknown sandbox is not found", 0, func(t *testing.T, s *subject) {
		_, err := s.s.UpdateNetwork(s.ctx, "nope", api.NetworkPolicy{Mode: api.NetworkDenyAll})
		s.wantCode("network update", err, errdefs.CodeNotFound)
	}},
	{"a network update of a released generation conflicts", 0, func(t *testing.T, s *subject) {
		s.claim(Claim("c1", 1))
		s.release(release("r1", 1))
		_, err := s.s.UpdateNetwork(s.ctx, id, api.NetworkPolicy{Mode: api.NetworkDenyAll})
		s.wantCode("network update of a released generation", err, errdefs.CodeConflict)
		if sb, err := s.s.Get(s.ctx, id); err != nil || sb.State != api.StateReleased {
			t.Errorf("after the refused update: %+v %v, want released", sb, err)
		}
	}},
	{"a live network update changes the ready generation's mode in place", LiveNetwork, func(t *testing.T, s *subject) {
		before := s.claim(Claim("c1", 1)).Sandbox
		restricted := api.NetworkPolicy{Mode: api.NetworkRestrict, Rules: []api.NetworkRule{{CIDR: "203.0.113.0/24", Protocol: "tcp", Ports: []string{"443"}}}}
		for i, p := range []api.NetworkPolicy{restricted, restricted, {Mode: api.NetworkOpen}, {}} {
			sb, err := s.s.UpdateNetwork(s.ctx, id, p)
			if err != nil {
				t.Fatalf("update %d to %s: %v", i, p.EffectiveMode(), err)
			}
			if sb.ID != id || sb.Generation != 1 || sb.State != api.StateReady || sb.LeaseID != before.LeaseID || sb.ContainerID != before.ContainerID {
				t.Errorf("update %d answered %+v, want the same ready generation 1", i, sb)
			}
			if sb.Network == nil || sb.Network.Mode != p.EffectiveMode() {
				t.Errorf("update %d answered network %+v, want mode %s", i, sb.Network, p.EffectiveMode())
			}
			got, err := s.s.Get(s.ctx, id)
			if err != nil || got.Network == nil || got.Network.Mode != p.EffectiveMode() {
				t.Errorf("get after update %d: network %+v %v, want mode %s", i, got.Network, err, p.EffectiveMode())
			}
		}
	}},
}

func init() { cases = append(cases, agentCases...) }
