package service

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
)

// dyingStore is the store of a replica that dies right after it admitted
// a create: AdmitCreate commits, then never returns (until the test
// ends), and from then on the replica renews no lease and sweeps nothing,
// as a process killed there would.
type dyingStore struct {
	manager.ServiceStore
	dead    atomic.Bool
	release chan struct{}
}

var errDead = errors.New("replica is dead")

func (d *dyingStore) AdmitCreate(ctx context.Context, in manager.Admission) error {
	if err := d.ServiceStore.AdmitCreate(ctx, in); err != nil {
		return err
	}
	d.dead.Store(true)
	<-d.release
	return errDead
}

func (d *dyingStore) RenewLeases(ctx context.Context, holder string, ids []string, ttl time.Duration) (int, error) {
	if d.dead.Load() {
		return 0, errDead
	}
	return d.ServiceStore.RenewLeases(ctx, holder, ids, ttl)
}

func (d *dyingStore) ExpiredLeases(ctx context.Context, kind string, limit int) ([]manager.OpLease, error) {
	if d.dead.Load() {
		return nil, errDead
	}
	return d.ServiceStore.ExpiredLeases(ctx, kind, limit)
}

func (d *dyingStore) AbandonOrphanIdempotent(ctx context.Context, olderThan time.Time) (int, error) {
	if d.dead.Load() {
		return 0, errDead
	}
	return d.ServiceStore.AbandonOrphanIdempotent(ctx, olderThan)
}

// TestCreateOfReplicaDeadAfterAdmissionIsAnsweredOnce: a replica that
// dies between admitting a create and anything after leaves the create
// to another replica, which finishes it and answers the caller's
// Idempotency-Key with it: the caller's retry gets that sandbox, never a
// second one. (With the create's lease taken after the admission, the
// dead replica left an admitted create no lease named, its key was
// forgotten as an orphan and the retry made a second sandbox.)
func TestCreateOfReplicaDeadAfterAdmissionIsAnsweredOnce(t *testing.T) {
	e := newEnv(t, func(s *Server) { s.LeaseTTL = time.Second })
	ctx := context.Background()
	dying := &dyingStore{ServiceStore: e.store, release: make(chan struct{})}
	addr := e.startReplica(dying, "replica-dead")
	t.Cleanup(func() { close(dying.release) })

	req := client.CreateRequest{Template: "busybox", Labels: map[string]string{"k": "dead-admit"}}
	cd := &client.Client{BaseURL: "http://" + addr, Key: e.keyA}
	cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := cd.Create(cctx, req, client.IdempotencyKey("k-dead"))
	ccancel()
	if err == nil || !dying.dead.Load() {
		t.Fatalf("create through the dying replica: %v (dead %v), want no answer after the admission", err, dying.dead.Load())
	}
	var sb client.Sandbox
	for deadline := time.Now().Add(15 * time.Second); ; {
		sb, err = e.a.Create(ctx, req, client.IdempotencyKey("k-dead"))
		var ce *client.Error
		if err == nil || !errors.As(err, &ce) || (ce.Code != client.CodeConflict && ce.Code != client.CodeUnavailable) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || sb.State != client.StateReady {
		t.Fatalf("retry through the live replica: %+v, %v; want the dead replica's create, ready", sb, err)
	}
	l, err := e.a.List(ctx, client.ListOptions{Labels: req.Labels})
	if err != nil || len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != sb.ID {
		t.Fatalf("sandboxes %+v, %v: want one, %s (the retry's answer)", l, err, sb.ID)
	}
	e.node.Lock()
	claims := len(e.node.ClaimOps)
	e.node.Unlock()
	if claims != 1 {
		t.Fatalf("the node got %d claims, want 1", claims)
	}
}

// lostAdmitStore commits the first admission but answers it as a lost
// connection (the database restarted as it committed).
type lostAdmitStore struct {
	manager.ServiceStore
	lost atomic.Bool
}

func (l *lostAdmitStore) AdmitCreate(ctx context.Context, in manager.Admission) error {
	if err := l.ServiceStore.AdmitCreate(ctx, in); err != nil || l.lost.Swap(true) {
		return err
	}
	return errdefs.Busy(time.Second, "database unavailable: conn closed")
}

// TestCreateWhoseAdmissionAnswerIsLostIsAnsweredOnce: an admission whose
// commit's answer was lost may have committed: the create answers 503 but
// keeps its Idempotency-Key and lease for a sweeper, which finds the
// create admitted, completes it and answers the key: the retry gets that
// sandbox, not a second one.
func TestCreateWhoseAdmissionAnswerIsLostIsAnsweredOnce(t *testing.T) {
	e := newEnv(t, func(s *Server) {
		s.LeaseTTL = time.Second
		s.Store = &lostAdmitStore{ServiceStore: s.Store}
	})
	ctx := context.Background()
	req := client.CreateRequest{Template: "busybox", Labels: map[string]string{"k": "lost-admit"}}
	if _, err := e.a.Create(ctx, req, client.IdempotencyKey("k-lost")); errCode(err) != client.CodeUnavailable {
		t.Fatalf("create whose admission's answer is lost: %v, want unavailable", err)
	}
	var sb client.Sandbox
	var err error
	for deadline := time.Now().Add(15 * time.Second); ; {
		sb, err = e.a.Create(ctx, req, client.IdempotencyKey("k-lost"))
		var ce *client.Error
		if err == nil || !errors.As(err, &ce) || (ce.Code != client.CodeConflict && ce.Code != client.CodeUnavailable) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || sb.State != client.StateReady {
		t.Fatalf("retry: %+v, %v; want the admitted create, ready", sb, err)
	}
	l, err := e.a.List(ctx, client.ListOptions{Labels: req.Labels})
	if err != nil || len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != sb.ID {
		t.Fatalf("sandboxes %+v, %v: want one, %s (the retry's answer)", l, err, sb.ID)
	}
}

// stallStore is the store of a replica whose database stalls right after
// it admitted a create (the commit landed; its answer came late): while
// stalled the replica renews no lease and sweeps nothing, so its lease
// expires; then it goes on with the create.
type stallStore struct {
	dyingStore
}

func (s *stallStore) AdmitCreate(ctx context.Context, in manager.Admission) error {
	if err := s.ServiceStore.AdmitCreate(ctx, in); err != nil {
		return err
	}
	s.dead.Store(true)
	<-s.release
	s.dead.Store(false)
	return nil
}

// TestCreateOfStalledReplicaTakenOverAnswersTheSandbox: a replica whose
// database stalls between a create's admission and its claim loses the
// create's lease; another replica takes the create over and finishes
// it. When the stalled replica goes on, it finds its sandbox already
// made and answers it (201): the same sandbox its caller's retry got.
// (It claimed again and answered 409 "sandbox ... is ready; destroy it
// first": TestServeReplicasOnPostgres saw it after a database restart.)
func TestCreateOfStalledReplicaTakenOverAnswersTheSandbox(t *testing.T) {
	e := newEnv(t, func(s *Server) { s.LeaseTTL = time.Second })
	ctx := context.Background()
	stalled := &stallStore{dyingStore{ServiceStore: e.store, release: make(chan struct{})}}
	addr := e.startReplica(stalled, "replica-stalled")
	req := client.CreateRequest{Template: "busybox", Labels: map[string]string{"k": "stalled-admit"}}
	cs := &client.Client{BaseURL: "http://" + addr, Key: e.keyA}
	type answer struct {
		sb  client.Sandbox
		err error
	}
	first := make(chan answer, 1)
	go func() {
		sb, err := cs.Create(ctx, req, client.IdempotencyKey("k-stall"))
		first <- answer{sb, err}
	}()
	for deadline := time.Now().Add(10 * time.Second); !stalled.dead.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("waited 10s for the replica to admit the create and stall")
		}
	}
	var sb client.Sandbox
	var err error
	for deadline := time.Now().Add(15 * time.Second); ; {
		sb, err = e.a.Create(ctx, req, client.IdempotencyKey("k-stall"))
		var ce *client.Error
		if err == nil || !errors.As(err, &ce) || (ce.Code != client.CodeConflict && ce.Code != client.CodeUnavailable) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || sb.State != client.StateReady {
		t.Fatalf("retry through the live replica while the other stalls: %+v, %v; want the create taken over, ready", sb, err)
	}
	close(stalled.release)
	var a answer
	select {
	case a = <-first:
	case <-time.After(15 * time.Second):
		t.Fatal("waited 15s for the stalled replica's answer")
	}
	if a.err != nil || a.sb.ID != sb.ID || a.sb.State != client.StateReady {
		t.Fatalf("the stalled replica answered %+v, %v; want %s ready (the create another replica finished)", a.sb, a.err, sb.ID)
	}
	l, err := e.a.List(ctx, client.ListOptions{Labels: req.Labels})
	if err != nil || len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != sb.ID {
		t.Fatalf("sandboxes %+v, %v: want one, %s", l, err, sb.ID)
	}
	if st := e.nodeState(sb.ID); st != api.StateReady {
		t.Fatalf("node has %s %s, want ready", sb.ID, st)
	}
}

// startReplica serves a second replica (id) on the env's node and database
// through store until the test ends: its address.
func (e *env) startReplica(store manager.ServiceStore, id string) string {
	m := &manager.Manager{Store: e.store, Client: &api.Client{SocketPath: e.socket}}
	srv := &Server{Manager: m, Store: store, Templates: testTemplates, Now: e.clock.now, TimerInterval: 20 * time.Millisecond,
		LeaseTTL: time.Second, ReplicaID: id}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	e.t.Cleanup(func() {
		cancel()
		<-served
	})
	return ln.Addr().String()
}
