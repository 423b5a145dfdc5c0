package service

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
)

// peekStore looks at a sandbox through the API before each write that
// settles a create, as a caller polling GET could at that moment.
type peekStore struct {
	manager.ServiceStore
	mu   sync.Mutex
	peek func()
}

func (p *peekStore) look() {
	p.mu.Lock()
	peek := p.peek
	p.mu.Unlock()
	if peek != nil {
		peek()
	}
}

func (p *peekStore) EndOwnedSandbox(ctx context.Context, id, reason string) error {
	p.look()
	return p.ServiceStore.EndOwnedSandbox(ctx, id, reason)
}

func (p *peekStore) AppendEvent(ctx context.Context, ev manager.ServiceEvent) (manager.ServiceEvent, error) {
	p.look()
	return p.ServiceStore.AppendEvent(ctx, ev)
}

func (p *peekStore) AbandonIdempotent(ctx context.Context, owner, key string) error {
	p.look()
	return p.ServiceStore.AbandonIdempotent(ctx, owner, key)
}

func (p *peekStore) ReleaseLease(ctx context.Context, id, holder string) error {
	p.look()
	return p.ServiceStore.ReleaseLease(ctx, id, holder)
}

// watchFailedReasons makes p record every look at sandbox *id (once it
// is known) that shows it failed: the reasons seen.
func watchFailedReasons(t *testing.T, p *peekStore, c *client.Client, id *sync.Map) func() []string {
	var mu sync.Mutex
	var seen []string
	p.mu.Lock()
	p.peek = func() {
		v, ok := id.Load("id")
		if !ok {
			return
		}
		sb, err := c.Get(context.Background(), v.(string))
		if err != nil || sb.State != client.StateFailed {
			return
		}
		mu.Lock()
		seen = append(seen, sb.Reason)
		mu.Unlock()
	}
	p.mu.Unlock()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

// TestFailedCreateIsNeverSeenWithoutItsReason: a create the node refuses
// for good is failed with the reason, and a caller that reads the sandbox
// at any moment of its settling sees it creating, or failed with the
// reason: never failed with none. (The manager recorded the claim failed
// in one transaction and the service the reason in a second: a GET in
// between saw "failed" and reason "".)
func TestFailedCreateIsNeverSeenWithoutItsReason(t *testing.T) {
	var peek *peekStore
	e := newEnv(t, func(s *Server) {
		peek = &peekStore{ServiceStore: s.Store}
		s.Store = peek
	})
	var id sync.Map
	seen := watchFailedReasons(t, peek, e.a, &id)
	e.node.Lock()
	e.node.FailClaim = func(req api.ClaimRequest) error {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "template busybox has no image")
	}
	e.node.Hold = func(kind, sid string, after bool) error {
		id.Store("id", sid)
		return nil
	}
	e.node.Unlock()
	if _, err := e.a.Create(context.Background(), client.CreateRequest{Template: "busybox"}); errCode(err) != client.CodeInvalidArgument {
		t.Fatalf("create the node refuses: %v, want invalid_argument", err)
	}
	v, _ := id.Load("id")
	sb := waitState(t, e.a, v.(string), client.StateFailed)
	if !strings.Contains(sb.Reason, "has no image") {
		t.Fatalf("failed create's reason %q, want the node's", sb.Reason)
	}
	got := seen()
	if len(got) == 0 {
		t.Fatal("no look at the failed sandbox while it settled: the test checks nothing")
	}
	for _, r := range got {
		if r != "create failed: template busybox has no image" {
			t.Fatalf("a caller saw the create failed without its reason (looks: %q)", got)
		}
	}
}

// TestTakenOverCreateIsNeverSeenFailedWithoutItsReason is
// TestKernelServeReplicaKilledMidCreate on the fake node: a replica dies
// while the node holds its claim, the node rolls the claim back (its
// caller went away), and the surviving replica's sweeper takes the
// create over and fails it with the reason: it finds it failed on the
// node, or still claiming, sends the claim again with its operation id
// and the node answers the rollback. A caller reading the sandbox at any
// moment of that settling sees it creating, or failed with the reason
// ("create interrupted: ..."), never failed with none or another (the
// pending claim was failed in one transaction, the reason recorded in a
// second), and the owner's share comes back.
func TestTakenOverCreateIsNeverSeenFailedWithoutItsReason(t *testing.T) {
	for _, tc := range []struct {
		name string
		// rolledBack: the node has finished its rollback when the
		// sweeper looks; else it is still claiming and refuses the
		// claim's repeat.
		rolledBack bool
	}{{"RolledBack", true}, {"RollingBack", false}} {
		t.Run(tc.name, func(t *testing.T) { takenOverFailed(t, tc.rolledBack) })
	}
}

func takenOverFailed(t *testing.T, rolledBack bool) {
	var peek *peekStore
	e := newEnv(t, func(s *Server) {
		s.LeaseTTL = time.Second
		peek = &peekStore{ServiceStore: s.Store}
		s.Store = peek
	})
	ctx := context.Background()
	dead := e.startDeadReplica(t)
	var id sync.Map
	seen := watchFailedReasons(t, peek, e.a, &id)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	rollback := errdefs.Errorf(errdefs.CodeInternal, "mount rootfs: mount overlay: context canceled")
	var claims int
	e.node.Lock()
	e.node.Hold = func(kind, sid string, after bool) error {
		if kind != "claim" || after {
			return nil
		}
		e.node.Lock()
		claims++
		first := claims == 1
		e.node.Unlock()
		if !first {
			// The repeat of the claim: answered as ctld answers a claim
			// it rolled back.
			e.node.Put(api.Sandbox{ID: sid, Generation: 1, State: api.StateFailed, Reason: rollback.Message})
			return rollback
		}
		// The replica that sent the claim dies; ctld, seeing its caller
		// gone, rolls the claim back.
		dead.store.dead.Store(true)
		state := api.StateClaiming
		if rolledBack {
			state = api.StateFailed
		}
		e.node.Put(api.Sandbox{ID: sid, Generation: 1, State: state, Reason: rollback.Message})
		id.Store("id", sid)
		<-release
		return errdefs.Errorf(errdefs.CodeUnavailable, "connection reset")
	}
	e.node.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err := dead.client.Create(cctx, client.CreateRequest{Template: "busybox"})
	cancel()
	if err == nil || !dead.store.dead.Load() {
		t.Fatalf("create through the dying replica: %v (dead %v), want no answer", err, dead.store.dead.Load())
	}
	v, _ := id.Load("id")
	sb := waitState(t, e.a, v.(string), client.StateFailed)
	if !strings.HasPrefix(sb.Reason, "create interrupted: ") {
		t.Fatalf("taken-over create's reason %q, want create interrupted: ...", sb.Reason)
	}
	if !strings.Contains(e.logs.String(), "taking over an operation") {
		t.Fatal("the live replica did not take the create over")
	}
	// The taker's last write lets the lease go (a look comes before it).
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := e.store.Lease(ctx, leaseCreate+"/"+v.(string)); errdefs.CodeOf(err) == errdefs.CodeNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the taker never let the create's lease go")
		}
		time.Sleep(10 * time.Millisecond)
	}
	got := seen()
	if len(got) == 0 {
		t.Fatal("no look at the failed sandbox while it settled: the test checks nothing")
	}
	for _, r := range got {
		if r != sb.Reason {
			t.Fatalf("a caller saw the create failed without its reason (looks: %q, reason %q)", got, sb.Reason)
		}
	}
	if u, err := e.store.Usage(ctx, "team-a"); err != nil || u.Sandboxes != 0 {
		t.Fatalf("usage %+v, %v; want the share back", u, err)
	}
	ops, err := e.store.Operations(ctx, v.(string))
	if err != nil || len(ops) != 1 || ops[0].State != manager.OpFailed || ops[0].Error == "" {
		t.Fatalf("operations %+v, %v; want the one claim, failed with the node's error", ops, err)
	}
	t.Logf("%s: %s", v, sb.Reason)
}

// deadReplica is a second server on the env's store and node whose store
// stops answering (renewals, sweeps) once marked dead, as a killed
// process would.
type deadReplica struct {
	store  *dyingStore
	client *client.Client
}

func (e *env) startDeadReplica(t *testing.T) deadReplica {
	t.Helper()
	dying := &dyingStore{ServiceStore: e.store, release: make(chan struct{})}
	close(dying.release) // its admissions return: it dies later
	m := &manager.Manager{Store: e.store, Client: &api.Client{SocketPath: e.socket}}
	srv := &Server{Manager: m, Store: &liveAdmit{dying}, Templates: testTemplates, Now: e.clock.now, TimerInterval: 20 * time.Millisecond,
		LeaseTTL: time.Second, ReplicaID: "replica-dead"}
	return deadReplica{store: dying, client: e.serveExtra(t, srv, e.keyA)}
}

// liveAdmit admits as the store does (dyingStore's AdmitCreate dies).
type liveAdmit struct{ *dyingStore }

func (l liveAdmit) AdmitCreate(ctx context.Context, in manager.Admission) error {
	return l.ServiceStore.AdmitCreate(ctx, in)
}

// serveExtra serves srv on a fresh port until the test ends and returns
// a client of it with key.
func (e *env) serveExtra(t *testing.T, srv *Server, key string) *client.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-served
	})
	return &client.Client{BaseURL: "http://" + ln.Addr().String(), Key: key}
}

// TestStateReasonKeepsInternalDetailInTheLog: the manager's reason for a
// failed generation reaches a caller classified like an answer: a public
// kind's message, never an internal one's detail.
func TestStateReasonKeepsInternalDetailInTheLog(t *testing.T) {
	for stored, want := range map[string]string{
		"invalid_argument: template busybox has no image":    "failed: template busybox has no image",
		"internal: mount /var/lib/ctld/scratch/x: EIO":       "failed: internal error (see the server's log)",
		"claim sb-1: dial unix /run/ctld/ctld.sock: refused": "failed: internal error (see the server's log)",
		"": "failed: internal error (see the server's log)",
	} {
		if got := stateReason(stored); got != want {
			t.Errorf("stateReason(%q) = %q, want %q", stored, got, want)
		}
	}
}

// endDyingStore is the store of a replica that dies as it ends a failed
// create's sandbox: the claim's failure is recorded, the end never is.
type endDyingStore struct {
	*dyingStore
	end chan struct{}
}

func (d endDyingStore) AdmitCreate(ctx context.Context, in manager.Admission) error {
	return d.ServiceStore.AdmitCreate(ctx, in)
}

func (d endDyingStore) EndOwnedSandbox(ctx context.Context, id, reason string) error {
	d.dead.Store(true)
	<-d.end
	return errDead
}

// TestCreateFailedByADeadReplicaIsEnded: a replica that dies between the
// node's refusal of a claim (recorded: the generation failed) and the end
// of the owner's sandbox leaves the create to a sweeper, which ends it
// with the reason: the owner's share comes back. (The sweeper found the
// create settled, the claim failed, and left the sandbox active: its
// share was taken for good.)
func TestCreateFailedByADeadReplicaIsEnded(t *testing.T) {
	e := newEnv(t, func(s *Server) { s.LeaseTTL = time.Second })
	ctx := context.Background()
	dying := endDyingStore{dyingStore: &dyingStore{ServiceStore: e.store}, end: make(chan struct{})}
	m := &manager.Manager{Store: e.store, Client: &api.Client{SocketPath: e.socket}}
	dead := e.serveExtra(t, &Server{Manager: m, Store: dying, Templates: testTemplates, Now: e.clock.now, TimerInterval: 20 * time.Millisecond,
		LeaseTTL: time.Second, ReplicaID: "replica-dead"}, e.keyA)
	t.Cleanup(func() { close(dying.end) })
	var id sync.Map
	e.node.Lock()
	e.node.FailClaim = func(req api.ClaimRequest) error {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "template busybox has no image")
	}
	e.node.Hold = func(kind, sid string, after bool) error {
		id.Store("id", sid)
		return nil
	}
	e.node.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err := dead.Create(cctx, client.CreateRequest{Template: "busybox"})
	cancel()
	if err == nil || !dying.dead.Load() {
		t.Fatalf("create through the dying replica: %v (dead %v), want no answer", err, dying.dead.Load())
	}
	v, _ := id.Load("id")
	for deadline := time.Now().Add(10 * time.Second); ; {
		u, err := e.store.Usage(ctx, "team-a")
		if err == nil && u.Sandboxes == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage %+v, %v; want the failed create's share back", u, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sb := waitState(t, e.a, v.(string), client.StateFailed)
	if !strings.Contains(sb.Reason, "create failed: template busybox has no image") {
		t.Fatalf("reason %q, want the node's refusal", sb.Reason)
	}
}
