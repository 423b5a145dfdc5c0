// Package service is the sandbox service of `ctl-manager serve`: an
// HTTP/1.1 + JSON API (/v1) with API keys, owners, quotas, idempotent
// mutating calls and sandbox lifetimes, over the manager (package
// manager) that drives ctld. Handlers are thin: decode, validate once,
// convert to the manager's types, make one call, convert back, map the
// error kind to the wire (errors.go). The wire types are package client's.
package service

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/manager"
)

// OpenAPI is the API's OpenAPI 3 document, served at /v1/openapi.json;
// the tests validate every request and response against it.
//
//go:embed openapi.json
var OpenAPI []byte

// Defaults of the Server's bounds.
const (
	DefaultMaxBodyBytes      = 1 << 20
	DefaultMaxFileBytes      = 64 << 20
	DefaultMaxReplayBytes    = 1 << 20
	DefaultCreateTimeout     = 2 * time.Minute
	DefaultMaxTimeout        = 24 * time.Hour
	DefaultTimerInterval     = time.Second
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultShutdownGrace     = 10 * time.Second
	DefaultBodyTimeout       = 30 * time.Second
	// DefaultIdempotencyTTL is how long answers are kept for replays.
	DefaultIdempotencyTTL = 24 * time.Hour
	// DefaultEventTTL is how long events are kept for followers' cursors.
	DefaultEventTTL = 24 * time.Hour
	// minUploadRate is the slowest file upload allowed (bytes/s): its
	// deadline is BodyTimeout plus its size at this rate.
	minUploadRate  = 1 << 20
	maxExecTimeout = time.Hour
)

// Server serves the API. Set the fields, then call Serve.
type Server struct {
	Manager *manager.Manager
	Store   manager.ServiceStore
	Log     *slog.Logger
	// Templates are what sandboxes may be created from.
	Templates []client.Template
	// Volumes makes and deletes persistent volumes; nil: the volume
	// endpoints that need the block store answer unavailable.
	Volumes VolumeBackend
	// Now is the clock of deadlines; nil: time.Now.
	Now func() time.Time
	// NewID returns a fresh sandbox id; nil: "sb-" + 80 random bits.
	NewID func() (string, error)

	// DefaultTimeout is a sandbox's timeout when its create names none
	// (0: none); MaxTimeout bounds what a caller may ask.
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
	// CreateTimeout bounds a create's wait for the claim.
	CreateTimeout time.Duration
	MaxBodyBytes  int64
	MaxFileBytes  int64
	// MaxReplayBytes bounds an answer kept for Idempotency-Key replays.
	MaxReplayBytes    int64
	TimerInterval     time.Duration
	ReadHeaderTimeout time.Duration
	// BodyTimeout bounds the arrival of a JSON body (a slow-loris body).
	BodyTimeout   time.Duration
	IdleTimeout   time.Duration
	ShutdownGrace time.Duration

	// IdempotencyTTL is how long an Idempotency-Key's answer is kept.
	IdempotencyTTL time.Duration
	// EventTTL is how long journaled events are kept.
	EventTTL time.Duration
	// MaxFollowers bounds the event streams open at once.
	MaxFollowers int

	// AfterMarkFiring, when set, runs after a timeout timer is marked
	// firing and before its release is sent; an error stops the firing
	// there (tests use it to stand for a manager that dies at that point).
	AfterMarkFiring func(sandboxID string) error

	// ReplicaID names this server among the replicas on its database
	// (replica.go); empty: a fresh random one. LeaseTTL is how long its
	// operation leases last unrenewed (0: DefaultLeaseTTL).
	ReplicaID string
	LeaseTTL  time.Duration
	// EventPoll is how often an event follower reads the journal for
	// other replicas' events (0: DefaultEventPoll).
	EventPoll time.Duration
	// UsagePull is how often the node's metering stream is pulled into
	// the store (usage.go); 0: not pulled.
	UsagePull time.Duration
	replica   replicaState

	bg      sync.WaitGroup
	baseCtx context.Context
	// inFlight counts each sandbox's exec, file and log calls running: an
	// idle timer does not fire under one.
	inFlight counter
	events   broker
	emitMu   sync.Mutex
	// exitsAfter is where the exit watch's next page starts (runTimers'
	// goroutine only); exitsPage its page (0: exitsPage; tests page small).
	exitsAfter string
	exitsPage  int
	// MaxExitDestroys bounds the on_exit destroys running at once (0:
	// DefaultMaxExitDestroys); exitDestroys are those running (exits.go).
	MaxExitDestroys int
	exitDestroys    exitDestroys
}

func (s *Server) log() *slog.Logger { return logging.OrDiscard(s.Log) }

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func orDefault[T int64 | time.Duration](v, d T) T {
	if v > 0 {
		return v
	}
	return d
}

func (s *Server) newID() (string, error) {
	if s.NewID != nil {
		return s.NewID()
	}
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate sandbox id: %w", err)
	}
	return "sb-" + hex.EncodeToString(b[:]), nil
}

// Serve answers on ln until ctx is done, runs the lifetime timers, and
// then shuts down: in-flight calls get ShutdownGrace, background creates
// are waited for.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.Manager == nil || s.Store == nil {
		return errors.New("serve: a manager and a store are required")
	}
	if s.ReplicaID == "" {
		id, err := NewReplicaID()
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		s.ReplicaID = id
	}
	s.log().Info("replica starts", "replica", s.ReplicaID, "lease_ttl", s.leaseTTL())
	s.baseCtx = ctx
	// Volumes left unsettled by a dead replica are settled before serving;
	// if the database is away now, in the background: a replica must serve
	// its 503s then, not exit (other replicas serve meanwhile anyway).
	if err := s.settleVolumes(ctx); errdefs.Is(err, errdefs.CodeUnavailable) {
		s.log().Warn("settle the volumes of dead replicas: database unavailable, retrying in the background", "err", err)
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			s.settleVolumesUntilDone(ctx)
		}()
	} else if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	// Interrupted operations (of this replica's previous life or of
	// another replica) are taken over once their leases expire.
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		s.runReplica(ctx)
	}()
	hs := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: orDefault(s.ReadHeaderTimeout, DefaultReadHeaderTimeout),
		IdleTimeout:       orDefault(s.IdleTimeout, DefaultIdleTimeout),
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log().Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	s.pullUsage(ctx)
	timersDone := make(chan struct{})
	go func() {
		defer close(timersDone)
		s.runTimers(ctx)
	}()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), orDefault(s.ShutdownGrace, DefaultShutdownGrace))
		err = hs.Shutdown(sctx)
		cancel()
		if err != nil {
			hs.Close()
		}
		<-errc
	}
	<-timersDone
	s.bg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// settleVolumesUntilDone runs settleVolumes until it succeeds, retrying
// while the database is unavailable.
func (s *Server) settleVolumesUntilDone(ctx context.Context) {
	for {
		err := s.settleVolumes(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		if !errdefs.Is(err, errdefs.CodeUnavailable) {
			s.log().Error("settle the volumes of dead replicas", "err", err)
			return
		}
		s.log().Warn("settle the volumes of dead replicas: database unavailable, retrying", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}
