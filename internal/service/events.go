package service

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/manager"
)

// The events stream (GET /v1/events, server-sent events): what happens to
// the caller's sandboxes, as it happens. Each event is journaled in the
// store with a sequence number (the SSE id) before it is sent, so a
// follower that names a cursor (after=SEQ or Last-Event-ID) first gets
// the journaled events after it, then the live ones: it resumes across a
// restart of the server. Each follower has a bounded queue; one that
// falls behind by a whole queue is cut off with an error event (it
// reconnects with its cursor), so a slow reader never holds the server's
// memory.

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

// emit journals an event, then sends it to the followers. Emits are
// serialized so followers see sequence numbers in order.
func (s *Server) emit(owner, sandboxID, typ, reason string) {
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	ev, err := s.Store.AppendEvent(context.Background(), manager.ServiceEvent{Owner: owner, SandboxID: sandboxID, Type: typ, Reason: reason, Time: s.now()})
	if err != nil {
		// The state change happened; only the journal of it is missing.
		s.log().Error("journal event", "sandbox", sandboxID, "type", typ, "err", err)
	}
	s.events.publish(owner, client.Event{Seq: ev.Seq, Type: typ, SandboxID: sandboxID, Reason: reason, Time: ev.Time.UTC()})
}

func eventOf(ev manager.ServiceEvent) client.Event {
	return client.Event{Seq: ev.Seq, Type: ev.Type, SandboxID: ev.SandboxID, Reason: ev.Reason, Time: ev.Time.UTC()}
}

// eventCursor is the follower's cursor: the after query parameter or the
// Last-Event-ID header (-1: none, live events only).
func eventCursor(r *http.Request) (int64, error) {
	v := r.URL.Query().Get("after")
	if v == "" {
		v = r.Header.Get("Last-Event-ID")
	}
	if v == "" {
		return -1, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, invalidf("after (or Last-Event-ID) must be an event's seq, 0 or more")
	}
	return n, nil
}

const replayPage = 256

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
	last, err := eventCursor(r)
	if err != nil {
		return err
	}
	// Subscribed before the replay, so nothing between the two is missed
	// (duplicates are dropped by seq).
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
	send := func(ev client.Event) error {
		b, _ := json.Marshal(ev)
		return e.eventID(ev.Type, strconv.FormatInt(ev.Seq, 10), b)
	}
	for last >= 0 {
		page, err := s.Store.Events(r.Context(), owner, sandbox, last, replayPage)
		if err != nil {
			c, msg, _ := classify(err)
			b, _ := json.Marshal(client.ErrorBody{Error: client.ErrorDetail{Code: c, Message: msg}})
			e.event(client.EventError, b)
			return nil
		}
		for _, ev := range page {
			if err := send(eventOf(ev)); err != nil {
				return nil
			}
			last = ev.Seq
		}
		if len(page) < replayPage {
			break
		}
	}
	tick := time.NewTicker(heartbeatEvery)
	defer tick.Stop()
	// Other replicas' events reach this follower through the journal,
	// polled (replica.go); a follower without a cursor polls from the
	// journal's end as it subscribed.
	if last < 0 {
		if last, err = s.Store.LastEventSeq(r.Context()); err != nil {
			last = -1
		}
	}
	j := &journalFollower{sent: map[int64]bool{}, floor: last, last: last}
	poll := time.NewTicker(orDefault(s.EventPoll, DefaultEventPoll))
	defer poll.Stop()
	for {
		select {
		case ev, ok := <-f.ch:
			if !ok {
				b, _ := json.Marshal(client.ErrorBody{Error: client.ErrorDetail{Code: client.CodeUnavailable, Message: "fell behind the event stream; follow again"}})
				e.event(client.EventError, b)
				return nil
			}
			if !j.fresh(ev.Seq) {
				continue
			}
			if err := send(ev); err != nil {
				return nil
			}
		case <-poll.C:
			if err := s.pollJournal(r.Context(), owner, sandbox, j, send); err != nil {
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
