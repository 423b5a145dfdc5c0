package node

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/node/guest"
)

// stuckRuntime is a runtime whose runsc step `step` of container cid
// never finishes, as
// runsc waits on a sandbox that never answers (issue 21: a claim at
// --runtime-pids 0 hung 10 minutes past --ready-timeout): freeze, when
// set, makes the real kernel's sandbox stop (the lease's cgroup.freeze)
// before the real step runs; else the step waits for its context, as a
// runsc process does until exec kills it.
type stuckRuntime struct {
	guest.Runtime
	step, cid string
	freeze    func(t testing.TB, cid string)
	t         testing.TB
}

func (s stuckRuntime) stuck(ctx context.Context, step, id string) error {
	if s.freeze != nil {
		s.freeze(s.t, id)
		return nil
	}
	<-ctx.Done()
	return fmt.Errorf("runsc %s %s: %w", step, id, ctx.Err())
}

func (s stuckRuntime) Create(ctx context.Context, id, bundle string) error {
	if s.step == "create" && id == s.cid {
		if err := s.stuck(ctx, "create", id); err != nil || s.freeze == nil {
			return err
		}
	}
	return s.Runtime.Create(ctx, id, bundle)
}

func (s stuckRuntime) Start(ctx context.Context, id string) error {
	if s.step == "start" && id == s.cid {
		if err := s.stuck(ctx, "start", id); err != nil || s.freeze == nil {
			return err
		}
	}
	return s.Runtime.Start(ctx, id)
}

// runscBoundCase claims on k whose runsc step never finishes: the claim
// must fail within limit (well below the caller's bound, k.timeout),
// saying which step timed out, with a clean proof, and the next
// generation claims and releases.
func runscBoundCase(t *testing.T, k *testKernel, step string, limit time.Duration) {
	r := newRig(t, k)
	r.mustBoot()
	start := time.Now()
	_, err, returned := r.claim(sb, claimReq("c1", 1))
	took := time.Since(start)
	if !returned || err == nil {
		t.Fatalf("claim with runsc %s stuck: returned %v, err %v; want it failed", step, returned, err)
	}
	t.Logf("claim with runsc %s stuck failed after %v: %v", step, took.Round(time.Millisecond), err)
	want := fmt.Sprintf("runsc %s did not finish within %v (the ready timeout); the guest was killed through its lease", step, k.readyTimeout)
	if !strings.Contains(err.Error(), want) {
		t.Errorf("claim error %q; want it to say %q", err, want)
	}
	if took >= limit {
		t.Errorf("the claim took %v with a ready timeout of %v: the runsc step was not bounded", took, k.readyTimeout)
	}
	if s := r.sandbox(sb); !strings.Contains(s.Reason, want) {
		t.Errorf("rolled back record's reason %q; want it to say %q", s.Reason, want)
	}
	claimFailed(r, claimReq("c1", 1), errdefs.CodeOf(err))
	reuse(r, 2)
}

// TestRunscStepsBoundedByReadyTimeout: runsc create and start each get
// the ready timeout; past it the claim is rolled back (failed, a clean
// proof) and says which step timed out.
func TestRunscStepsBoundedByReadyTimeout(t *testing.T) {
	for _, step := range []string{"create", "start"} {
		t.Run(step, func(t *testing.T) {
			tk, _ := fakeKernel(t)
			tk.readyTimeout = 300 * time.Millisecond
			tk.runtime = stuckRuntime{Runtime: tk.runtime, step: step, cid: containerID(sb, 1), t: t}
			runscBoundCase(t, tk, step, 5*time.Second)
		})
	}
}
