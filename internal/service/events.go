package service

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/ctld/ctld/client"
)

// The events stream (GET /v1/events, server-sent events): what happens to
// the caller's sandboxes, as it happens. Events live in memory only: a
// follower sees what happens while it follows (after a restart, GET shows
// the state). Each follower has a bounded queue; one that falls behind by
// a whole queue is cut off with an error event (it reconnects and reads
// the state again), so a slow reader never holds the server's memory.

const (
	DefaultMaxFollowers = 2048
	followerQueue       = 256
	heartbeatEvery      = 15 * time.Second
)

type follower struct {
	owner, sandbox string
	ch             chan client.Event
	dropped        bool
}

type broker struct {
	mu        sync.Mutex
	followers map[*follower]struct{}
}

func (b *broker) subscribe(owner, sandbox string, limit int) *follower {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.followers == nil {
		b.followers = map[*follower]struct{}{}
	}
	if len(b.followers) >= limit {
		return nil
	}
	f := &follower{owner: owner, sandbox: sandbox, ch: make(chan client.Event, followerQueue)}
	b.followers[f] = struct{}{}
	return f
}

func (b *broker) unsubscribe(f *follower) {
	b.mu.Lock()
	delete(b.followers, f)
	b.mu.Unlock()
}

func (b *broker) publish(owner string, ev client.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for f := range b.followers {
		if f.owner != owner || (f.sandbox != "" && f.sandbox != ev.SandboxID) || f.dropped {
			continue
		}
		select {
		case f.ch <- ev:
		default:
			f.dropped = true
			close(f.ch)
		}
	}
}

func (s *Server) emit(owner, sandboxID, typ, reason string) {
	s.events.publish(owner, client.Event{Type: typ, SandboxID: sandboxID, Reason: reason, Time: s.now().UTC()})
}

func (s *Server) followEvents(w http.ResponseWriter, r *http.Request, owner string) error {
	sandbox := r.URL.Query().Get("sandbox")
	if sandbox != "" {
		if err := checkID(sandbox); err != nil {
			return err
		}
		// Another owner's sandbox is not_found, as everywhere.
		if _, err := s.Store.OwnedSandbox(r.Context(), owner, sandbox); err != nil {
			return err
		}
	}
	f := s.events.subscribe(owner, sandbox, int(orDefault(int64(s.MaxFollowers), DefaultMaxFollowers)))
	if f == nil {
		return errorf(client.CodeUnavailable, "too many event followers; retry later")
	}
	defer s.events.unsubscribe(f)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	e := &sse{w: w, rc: http.NewResponseController(w)}
	if err := e.comment("following"); err != nil {
		return nil
	}
	tick := time.NewTicker(heartbeatEvery)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-f.ch:
			if !ok {
				b, _ := json.Marshal(client.ErrorBody{Error: client.ErrorDetail{Code: client.CodeUnavailable, Message: "fell behind the event stream; follow again"}})
				e.event(client.EventError, b)
				return nil
			}
			b, _ := json.Marshal(ev)
			if err := e.event(ev.Type, b); err != nil {
				return nil
			}
		case <-tick.C:
			if err := e.comment("heartbeat"); err != nil {
				return nil
			}
		case <-r.Context().Done():
			return nil
		case <-s.baseCtx.Done():
			return nil
		}
	}
}
