package service

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
)

// Replicas: any number of servers may run on one database, each with its
// own id. Every service operation in flight holds an operation lease in
// the store (manager.OpLease): a create ("create/<sandbox>", taken before
// the create is admitted), a destroy ("destroy/<sandbox>"), a timer's
// firing ("timeout/<sandbox>", "idle/<sandbox>"), a volume's create or
// delete ("volume/<id>") and an idempotent call ("call/<owner>/<key>"). The replica renews all its leases in one
// statement every LeaseTTL/3. A replica that dies leaves its leases to
// expire; then any replica's sweeper takes each over and finishes the
// operation: a create is claimed with the operation id the manager
// recorded for it (ctld answers a repeated id with the same sandbox: the
// claim happens once), a destroy is released the same way, a timer is
// fired again by whoever finds it due. An operation that can no longer
// complete is failed with the reason. The caller's Idempotency-Key, kept
// on the lease, gets the finished operation's answer, so its retry gets
// that answer, not a second sandbox.

// DefaultLeaseTTL is how long an operation lease lasts unrenewed: the
// time a dead replica's operations wait before another takes them.
const DefaultLeaseTTL = 15 * time.Second

const (
	// maxTakeovers: an operation taken over this many times (each taker
	// died or could not finish it) is failed rather than tried again.
	maxTakeovers = 5
	sweepBatch   = 64
	// legacyEvery: sweeps between scans for unsettled creates no lease
	// names (a replica died between the admission and the lease) and for
	// orphan Idempotency-Keys.
	legacyEvery = 30
)

// Lease kinds.
const (
	leaseCreate  = "create"
	leaseDestroy = "destroy"
	leaseTimeout = "timeout"
	leaseIdle    = "idle"
	leaseCall    = "call"
	leaseVolume  = "volume"
)

// replicaState is what a replica keeps in memory: the operations it runs
// now (its sweeper never takes one of its own running leases).
type replicaState struct {
	mu      sync.Mutex
	running map[string]bool
}

func (s *Server) leaseTTL() time.Duration { return orDefault(s.LeaseTTL, DefaultLeaseTTL) }

// NewReplicaID returns a fresh replica id: "r-" + 64 random bits.
func NewReplicaID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate replica id: %w", err)
	}
	return "r-" + hex.EncodeToString(b[:]), nil
}

func (s *Server) startOp(id string) bool {
	s.replica.mu.Lock()
	defer s.replica.mu.Unlock()
	if s.replica.running == nil {
		s.replica.running = map[string]bool{}
	}
	if s.replica.running[id] {
		return false
	}
	s.replica.running[id] = true
	return true
}

// runningOps are the operations this replica runs now: the leases it
// renews.
func (s *Server) runningOps() []string {
	s.replica.mu.Lock()
	defer s.replica.mu.Unlock()
	out := make([]string, 0, len(s.replica.running))
	for id := range s.replica.running {
		out = append(out, id)
	}
	return out
}

func (s *Server) endOp(id string) {
	s.replica.mu.Lock()
	delete(s.replica.running, id)
	s.replica.mu.Unlock()
}

// idemCall is the Idempotency-Key of the call a handler runs under.
type idemCall struct {
	owner, key string
	body       *hashingBody

	mu sync.Mutex
	// handedOff: the call's operation was left unsettled to a sweeper,
	// which records the answer for the key: an error answered meanwhile
	// must not free the key (a retry would run the operation twice).
	handedOff bool
	// held are the leases of operations the call settled, let go only
	// once its answer is recorded (done): a replica that dies in between
	// leaves the lease to a sweeper, which records the answer.
	held []string
	done bool
}

// finish lets go of the leases the call held for its answer, which is
// now recorded (or the key forgotten).
func (c *idemCall) finish(ctx context.Context, s *Server) {
	c.mu.Lock()
	c.done = true
	held := c.held
	c.mu.Unlock()
	for _, id := range held {
		s.letGo(ctx, id, true)
	}
}

type idemCtxKey struct{}

// opLease is the lease of an operation that r starts: with r's
// Idempotency-Key and its request's hash, when it has one (call after
// the body is decoded: the hash is then whole).
func (s *Server) opLease(r *http.Request, kind, owner, sandboxID string) manager.OpLease {
	l := manager.OpLease{ID: kind + "/" + sandboxID, Kind: kind, SandboxID: sandboxID, Owner: owner, Holder: s.ReplicaID}
	if c, ok := r.Context().Value(idemCtxKey{}).(*idemCall); ok {
		l.IdemOwner, l.IdemKey, l.RequestHash = c.owner, c.key, s.drain(c.body)
	}
	return l
}

// holdLease takes l for this replica: an operation another live replica
// (or this one) runs is unavailable, to retry.
func (s *Server) holdLease(ctx context.Context, l manager.OpLease) error {
	if !s.startOp(l.ID) {
		return errdefs.Busy(time.Second, "operation %s is running here; retry", l.ID)
	}
	cur, ok, err := s.Store.TakeLease(ctx, l, s.leaseTTL())
	if err != nil || !ok {
		s.endOp(l.ID)
	}
	if err != nil {
		return err
	}
	if !ok {
		return errdefs.Busy(time.Second, "operation %s is running on replica %s; retry", l.ID, cur.Holder)
	}
	return nil
}

// letGo ends this replica's part in operation id: settled, its lease is
// released; unsettled (the node's answer is unknown), it is expired for a
// sweeper to finish.
func (s *Server) letGo(ctx context.Context, id string, settled bool) {
	defer s.endOp(id)
	ctx = context.WithoutCancel(ctx)
	var err error
	if settled {
		err = s.Store.ReleaseLease(ctx, id, s.ReplicaID)
	} else {
		err = s.Store.ExpireLease(ctx, id, s.ReplicaID)
	}
	if err != nil {
		// It expires by itself: a sweeper settles what is left.
		s.log().Warn("let an operation lease go", "operation", id, "settled", settled, "err", err)
	}
}

// letGoOf is letGo for an operation r started: one left unsettled keeps
// r's Idempotency-Key for the sweeper that finishes it; a settled one
// keeps its lease until r's answer is recorded.
func (s *Server) letGoOf(ctx context.Context, r *http.Request, id string, settled bool) {
	if c, ok := r.Context().Value(idemCtxKey{}).(*idemCall); ok {
		c.mu.Lock()
		if !settled {
			c.handedOff = true
		} else if !c.done {
			c.held = append(c.held, id)
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
	}
	s.letGo(ctx, id, settled)
}

// createSettled reports whether id's create has its outcome: the
// sandbox ended (failed) or its claim is recorded done or failed.
func (s *Server) createSettled(ctx context.Context, owner, id string) (bool, error) {
	o, err := s.Store.OwnedSandbox(context.WithoutCancel(ctx), owner, id)
	if errdefs.CodeOf(err) == errdefs.CodeNotFound {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return !o.Active || (o.State != "" && o.State != string(api.StateClaiming)), nil
}

// releasePending reports whether id has a release the node has not
// answered.
func (s *Server) releasePending(ctx context.Context, id string) (bool, error) {
	ops, err := s.Manager.Store.Operations(context.WithoutCancel(ctx), id)
	if err != nil && errdefs.CodeOf(err) != errdefs.CodeNotFound {
		return false, err
	}
	for _, op := range ops {
		if op.Kind == manager.KindRelease && op.State == manager.OpPending {
			return true, nil
		}
	}
	return false, nil
}

// runReplica renews this replica's leases and sweeps expired ones until
// ctx is done.
func (s *Server) runReplica(ctx context.Context) {
	ttl := s.leaseTTL()
	renew := time.NewTicker(ttl / 3)
	defer renew.Stop()
	sweep := time.NewTicker(min(orDefault(s.TimerInterval, DefaultTimerInterval), ttl/3))
	defer sweep.Stop()
	for n := 0; ; n++ {
		s.sweep(ctx, n%legacyEvery == 0)
		select {
		case <-ctx.Done():
			return
		case <-renew.C:
			if _, err := s.Store.RenewLeases(ctx, s.ReplicaID, s.runningOps(), ttl); err != nil && ctx.Err() == nil {
				s.log().Warn("renew operation leases", "replica", s.ReplicaID, "err", err)
			}
		case <-sweep.C:
		}
	}
}

// sweep takes the expired leases of creates and destroys and finishes
// each in the background, and forgets the Idempotency-Keys of calls that
// died with their replica.
func (s *Server) sweep(ctx context.Context, legacy bool) {
	for _, kind := range []string{leaseCreate, leaseDestroy} {
		exp, err := s.Store.ExpiredLeases(ctx, kind, sweepBatch)
		if err != nil {
			if ctx.Err() == nil {
				s.log().Warn("list expired operation leases", "kind", kind, "err", err)
			}
			return
		}
		for _, l := range exp {
			s.takeOver(ctx, l)
		}
	}
	if !legacy {
		return
	}
	s.sweepUnleased(ctx)
	if err := s.settleVolumes(ctx); err != nil && ctx.Err() == nil {
		s.log().Warn("settle volumes", "err", err)
	}
	if n, err := s.Store.AbandonOrphanIdempotent(ctx, s.now().Add(-s.leaseTTL())); err != nil && ctx.Err() == nil {
		s.log().Warn("forget orphan idempotency keys", "err", err)
	} else if n > 0 {
		s.log().Info("forgot idempotency keys of calls that died with their replica", "count", n)
	}
}

// sweepUnleased takes the unsettled creates that no lease names and that
// are older than any create still running could be: a replica died
// between the admission and the lease, or a server of before the leases
// left them.
func (s *Server) sweepUnleased(ctx context.Context) {
	pending, err := s.Store.UnsettledCreates(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log().Warn("list unsettled creates", "err", err)
		}
		return
	}
	cutoff := s.now().Add(-orDefault(s.CreateTimeout, DefaultCreateTimeout) - s.leaseTTL())
	for _, o := range pending {
		if o.Paused || o.CreatedAt.After(cutoff) {
			continue
		}
		if _, err := s.Store.Lease(ctx, leaseCreate+"/"+o.ID); errdefs.CodeOf(err) != errdefs.CodeNotFound {
			continue
		}
		s.takeOver(ctx, manager.OpLease{ID: leaseCreate + "/" + o.ID, Kind: leaseCreate, SandboxID: o.ID, Owner: o.Owner})
	}
}

// takeOver takes l for this replica and finishes its operation in the
// background.
func (s *Server) takeOver(ctx context.Context, l manager.OpLease) {
	if !s.startOp(l.ID) {
		return
	}
	want := l
	want.Holder = s.ReplicaID
	got, ok, err := s.Store.TakeLease(ctx, want, s.leaseTTL())
	if err != nil || !ok {
		s.endOp(l.ID)
		return
	}
	s.log().Info("taking over an operation", "operation", got.ID, "from", l.Holder, "attempt", got.Attempts, "replica", s.ReplicaID)
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		var settled bool
		switch got.Kind {
		case leaseCreate:
			settled = s.finishCreate(ctx, got)
		case leaseDestroy:
			settled = s.finishDestroy(ctx, got)
		}
		s.letGo(ctx, got.ID, settled)
	}()
}

// finishCreate completes or fails a create another replica left (or gave
// up): reports whether it is settled. The node decides: a sandbox it has
// ready or claiming is completed by sending the recorded claim again
// with its operation id; one it does not have is claimed (with the
// recorded operation id, if the claim got that far) while the create is
// younger than CreateTimeout, and failed with the reason after that,
// since its caller stopped waiting; one the node ended is failed.
func (s *Server) finishCreate(ctx context.Context, l manager.OpLease) bool {
	log := s.log().With("sandbox", l.SandboxID, "owner", l.Owner, "attempt", l.Attempts)
	settled, err := s.createSettled(ctx, l.Owner, l.SandboxID)
	if err != nil {
		log.Warn("read a create to take over", "err", err)
		return false
	}
	o, err := s.Store.OwnedSandbox(ctx, l.Owner, l.SandboxID)
	if errdefs.CodeOf(err) == errdefs.CodeNotFound {
		// Never admitted: the replica died before. Nothing to finish.
		s.abandonIdem(ctx, l)
		return true
	}
	if err != nil {
		log.Warn("read a create to take over", "err", err)
		return false
	}
	if settled {
		if err := s.endFailedCreate(ctx, o); err != nil {
			log.Warn("end a failed create another replica left", "err", err)
			return false
		}
		s.answerCreate(ctx, l)
		return true
	}
	var rec record
	if err := json.Unmarshal(o.Spec, &rec); err != nil {
		log.Error("decode the spec of a create to take over", "err", err)
		return false
	}
	fail := func(reason string) bool {
		if err := s.failUnsettled(ctx, o, reason); err != nil {
			log.Error("mark an interrupted create failed", "err", err)
			return false
		}
		log.Warn("an interrupted create is marked failed", "reason", reason)
		s.emit(o.Owner, o.ID, client.EventFailed, reason)
		s.abandonIdem(ctx, l)
		return true
	}
	if l.Attempts > maxTakeovers {
		return fail(fmt.Sprintf("create interrupted: %d replicas took it over and none finished it", l.Attempts-1))
	}
	complete := o.Paused
	if !complete {
		nsb, err := s.Manager.NodeSandbox(ctx, o.ID)
		switch {
		case err == nil && (nsb.State == api.StateReady || nsb.State == api.StateClaiming):
			log.Info("completing a create another replica left: the node has it "+string(nsb.State), "generation", nsb.Generation)
			complete = true
		case err == nil:
			return fail("create interrupted: its replica stopped during it and the node has the sandbox " + string(nsb.State))
		case errdefs.CodeOf(err) == errdefs.CodeNotFound && s.now().Sub(o.CreatedAt) < orDefault(s.CreateTimeout, DefaultCreateTimeout):
			log.Info("completing a create another replica left before the node took its claim")
			complete = true
		case errdefs.CodeOf(err) == errdefs.CodeNotFound:
			return fail("create interrupted: its replica stopped before the node took the claim, and the create timeout passed")
		default:
			log.Warn("a create another replica left waits: the node does not answer", "err", err)
			return false
		}
	}
	switch {
	case rec.Fork != nil && !o.Paused:
		s.forkAndClaim(ctx, o.Owner, o.ID, rec)
	case o.Paused:
		log.Info("completing a resume another replica left")
		if _, err := s.Manager.Resume(ctx, o.ID); err == nil {
			if err := errors.Join(s.Store.SetPaused(ctx, o.ID, false), s.Store.RearmIdle(ctx, o.ID, s.now())); err != nil {
				log.Warn("record a resumed sandbox", "err", err)
				return false
			}
			s.emit(o.Owner, o.ID, client.EventResumed, "")
		}
	default:
		s.claim(ctx, o.Owner, o.ID, rec.Spec, interruptedPrefix)
	}
	if settled, err = s.createSettled(ctx, l.Owner, l.SandboxID); err != nil || !settled {
		return false
	}
	s.answerCreate(ctx, l)
	return true
}

// endFailedCreate ends a create whose claim failed but whose owner's
// sandbox is still active: its replica died between the two (the share
// came back only at the end). A paused sandbox whose resume failed stays:
// it may be resumed again; so does one past its first generation.
func (s *Server) endFailedCreate(ctx context.Context, o manager.OwnedSandbox) error {
	st := api.SandboxState(o.State)
	if !o.Active || o.Paused || o.Generation > 1 || (st != api.StateFailed && st != api.StateLost) {
		return nil
	}
	reason := failedPrefix + strings.TrimPrefix(stateReason(o.StateReason), "failed: ")
	if err := s.Store.EndOwnedSandbox(ctx, o.ID, reason); err != nil {
		return err
	}
	s.emit(o.Owner, o.ID, client.EventFailed, reason)
	return nil
}

// answerCreate records a finished create's answer for its caller's
// Idempotency-Key: the sandbox as it is (created), or the key forgotten
// (it failed: a retry creates anew).
func (s *Server) answerCreate(ctx context.Context, l manager.OpLease) {
	if l.IdemKey == "" {
		return
	}
	o, err := s.Store.OwnedSandbox(ctx, l.Owner, l.SandboxID)
	if err != nil || !o.Active {
		s.abandonIdem(ctx, l)
		return
	}
	s.recordIdem(ctx, l, http.StatusCreated, s.view(o))
}

func (s *Server) recordIdem(ctx context.Context, l manager.OpLease, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	b = append(b, '\n')
	rec := manager.IdempotencyRecord{RequestHash: l.RequestHash, Status: status, ContentType: "application/json", Body: b}
	if err := s.Store.FinishIdempotent(context.WithoutCancel(ctx), l.IdemOwner, l.IdemKey, rec); err != nil {
		s.log().Warn("record the answer of a taken-over operation", "operation", l.ID, "err", err)
	}
}

func (s *Server) abandonIdem(ctx context.Context, l manager.OpLease) {
	if l.IdemKey == "" {
		return
	}
	if err := s.Store.AbandonIdempotent(context.WithoutCancel(ctx), l.IdemOwner, l.IdemKey); err != nil {
		s.log().Warn("forget the Idempotency-Key of a taken-over operation", "operation", l.ID, "err", err)
	}
}

// finishDestroy completes a destroy another replica left: the manager's
// Destroy sends its pending release again with its operation id (or
// answers the release already done) and the owner's share comes back on
// a verified, clean proof, as in the handler. Reports whether it is
// settled.
func (s *Server) finishDestroy(ctx context.Context, l manager.OpLease) bool {
	log := s.log().With("sandbox", l.SandboxID, "owner", l.Owner, "attempt", l.Attempts)
	o, err := s.Store.OwnedSandbox(ctx, l.Owner, l.SandboxID)
	if err != nil {
		log.Warn("read a destroy to take over", "err", err)
		return errdefs.CodeOf(err) == errdefs.CodeNotFound
	}
	res, err := s.Manager.Destroy(ctx, o.ID)
	if err != nil {
		pending, perr := s.releasePending(ctx, o.ID)
		if perr == nil && !pending {
			// The node refused it for good: there is nothing to finish.
			log.Warn("a destroy another replica left failed", "err", err)
			s.abandonIdem(ctx, l)
			return true
		}
		if l.Attempts > maxTakeovers {
			log.Error("a destroy another replica left is given up: its release stays pending (a destroy retries it)", "err", err)
			s.abandonIdem(ctx, l)
			return true
		}
		log.Warn("a destroy another replica left waits for the node", "err", err)
		return false
	}
	if res.Verdict.OK() {
		if err := s.Store.EndOwnedSandbox(ctx, o.ID, "destroyed"); err != nil {
			log.Warn("end a destroyed sandbox", "err", err)
			return false
		}
		if o.Active {
			s.emit(o.Owner, o.ID, client.EventDestroyed, "destroyed")
		}
	} else {
		log.Warn("sandbox released but its cleanup is unproven: its quota share stays taken", "reason", res.Verdict.Reason)
	}
	log.Info("completed a destroy another replica left", "operation", res.OperationID, "already_released", res.AlreadyReleased)
	if l.IdemKey != "" {
		if o, err = s.Store.OwnedSandbox(ctx, l.Owner, o.ID); err == nil {
			s.recordIdem(ctx, l, http.StatusOK, client.DestroyResult{Sandbox: s.view(o), Proof: proofOf(res.Verdict)})
		}
	}
	return true
}

// timerLease takes the lease of a timer's firing (kind leaseTimeout or
// leaseIdle): ok is false when another replica fires it now.
func (s *Server) timerLease(ctx context.Context, kind, owner, id string) (string, bool) {
	l := manager.OpLease{ID: kind + "/" + id, Kind: kind, SandboxID: id, Owner: owner, Holder: s.ReplicaID}
	if err := s.holdLease(ctx, l); err != nil {
		if errdefs.CodeOf(err) != errdefs.CodeUnavailable {
			s.log().Warn("take the lease of a timer", "operation", l.ID, "err", err)
		}
		return "", false
	}
	return l.ID, true
}

// DefaultEventPoll is how often a follower polls the journal.
const DefaultEventPoll = time.Second

// journalLookback: a poll reads again this many sequence numbers below
// the highest sent, so an event another replica's transaction committed
// after a higher one (PostgreSQL hands out sequence numbers before the
// commit) is still delivered; sent keeps them from going out twice.
const journalLookback = 256

// journalFollower is what a follower sent: the highest seq, and each seq
// in the lookback window.
type journalFollower struct {
	// floor: what the follower got before (its replay): never again.
	floor, last int64
	sent        map[int64]bool
}

// fresh reports whether seq is yet to be sent and marks it sent (0, an
// event not journaled, is always sent).
func (j *journalFollower) fresh(seq int64) bool {
	if seq == 0 {
		return true
	}
	if j.sent[seq] || seq <= j.floor || (j.last >= 0 && seq <= j.last-journalLookback) {
		return false
	}
	j.sent[seq] = true
	if seq > j.last {
		j.last = seq
		for s := range j.sent {
			if s <= j.last-journalLookback {
				delete(j.sent, s)
			}
		}
	}
	return true
}

// pollJournal sends the journaled events of owner (and sandbox) that the
// follower has not sent: those of the other replicas.
func (s *Server) pollJournal(ctx context.Context, owner, sandbox string, j *journalFollower, send func(client.Event) error) error {
	after := max(j.last-journalLookback, j.floor, 0)
	for {
		page, err := s.Store.Events(ctx, owner, sandbox, after, replayPage)
		if err != nil {
			// The database is away: the next tick tries again.
			return nil
		}
		for _, ev := range page {
			after = ev.Seq
			if !j.fresh(ev.Seq) {
				continue
			}
			if err := send(eventOf(ev)); err != nil {
				return err
			}
		}
		if len(page) < replayPage {
			return nil
		}
	}
}
