package client

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/agent/wire"
)

// hostile is an "agent" that reads the request and then answers with
// answer (raw bytes, written by write) — garbage, oversized, or nothing.
func hostile(t testing.TB, write func(c net.Conn)) *Client {
	return &Client{Dial: func(ctx context.Context) (net.Conn, error) {
		a, b := net.Pipe()
		go func() {
			defer b.Close()
			if _, _, err := wire.ReadFrame(b, nil, 0); err != nil {
				return
			}
			go io.Copy(io.Discard, b) // stdin and the like
			write(b)
		}()
		return a, nil
	}, CallTimeout: 500 * time.Millisecond}
}

func header(t wire.Type, n uint32) []byte {
	b := []byte{byte(t), 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], n)
	return b
}

func TestHostileAgent(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name  string
		write func(net.Conn)
	}{
		{"oversized frame (10 GiB announced)", func(c net.Conn) { c.Write(header(wire.TResult, 0xffffffff)) }},
		{"oversized result", func(c net.Conn) { wire.WriteFrame(c, wire.TResult, make([]byte, maxSmall+1)) }},
		{"garbage", func(c net.Conn) { c.Write([]byte("HTTP/1.1 200 OK\r\n\r\nhello")) }},
		{"unknown frame type", func(c net.Conn) { wire.WriteFrame(c, 'Z', []byte("{}")) }},
		{"truncated frame", func(c net.Conn) { c.Write(header(wire.TResult, 100)); c.Write([]byte("{")) }},
		{"nothing, connection closed", func(c net.Conn) {}},
		{"silent", func(c net.Conn) { time.Sleep(time.Hour) }},
		{"bad json", func(c net.Conn) { wire.WriteFrame(c, wire.TResult, []byte(`{"nonce":`)) }},
		{"unknown field", func(c net.Conn) { wire.WriteFrame(c, wire.TResult, []byte(`{"nonce":"n","x":1}`)) }},
		{"trailing data", func(c net.Conn) { wire.WriteFrame(c, wire.TResult, []byte(`{"nonce":"n"}{}`)) }},
		{"error frame without code", func(c net.Conn) { wire.WriteFrame(c, wire.TError, []byte(`{"message":"m"}`)) }},
		{"endless stream", func(c net.Conn) {
			for wire.WriteFrame(c, wire.TData, make([]byte, wire.MaxPayload)) == nil {
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := hostile(t, tc.write)
			start := time.Now()
			if n, err := c.Ready(ctx); err == nil || !errors.Is(err, ErrAgent) {
				t.Errorf("ready = %q, %v; want an ErrAgent error", n, err)
			}
			if _, err := c.List(ctx, "/", nil); err == nil || !errors.Is(err, ErrAgent) {
				t.Errorf("list: %v; want an ErrAgent error", err)
			}
			if _, err := c.Stat(ctx, "/", nil); err == nil || !errors.Is(err, ErrAgent) {
				t.Errorf("stat: %v; want an ErrAgent error", err)
			}
			// Streams are bounded by the caller's context and limit.
			sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			if _, err := c.ReadFile(sctx, "/f", nil, 1<<20, io.Discard); err == nil {
				t.Error("read succeeded")
			}
			if _, err := c.Exec(sctx, ExecRequest{Args: []string{"x"}}, Streams{Stdout: io.Discard}); err == nil && tc.name != "endless stream" {
				t.Error("exec succeeded")
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("calls took %v", d)
			}
		})
	}
}

// An endless output is the caller's to bound: its context ends the call.
func TestHostileEndlessExecEndsWithContext(t *testing.T) {
	c := hostile(t, func(c net.Conn) {
		for wire.WriteFrame(c, wire.TStdout, make([]byte, wire.MaxPayload)) == nil {
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var n countWriter
	_, err := c.Exec(ctx, ExecRequest{Args: []string{"x"}}, Streams{Stdout: &n})
	if !errors.Is(err, ErrAgent) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("exec = %v; want ErrAgent and the deadline", err)
	}
}

type countWriter int64

func (w *countWriter) Write(p []byte) (int, error) { *w += countWriter(len(p)); return len(p), nil }

// The client's memory does not follow an answer's announced size.
func TestHostileHugeAnnouncedFrameAllocatesNothing(t *testing.T) {
	c := hostile(t, func(c net.Conn) { c.Write(header(wire.TData, 0x7fffffff)); time.Sleep(time.Second) })
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := c.ReadFile(context.Background(), "/f", nil, 0, io.Discard)
	runtime.ReadMemStats(&after)
	if err == nil || !errors.Is(err, wire.ErrFrame) && !strings.Contains(err.Error(), "limit") {
		t.Fatalf("read = %v", err)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
		t.Fatalf("allocated %d bytes for a refused frame", d)
	}
}

// A bad exit frame is refused.
func TestHostileExit(t *testing.T) {
	for _, p := range []string{`{"code":300}`, `{"code":-5}`, `{"code":0,"signal":99}`, `{"code":"0"}`, `null x`} {
		c := hostile(t, func(c net.Conn) { wire.WriteFrame(c, wire.TExit, []byte(p)) })
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Exec(ctx, ExecRequest{Args: []string{"x"}}, Streams{})
		cancel()
		if !errors.Is(err, ErrAgent) {
			t.Errorf("exit %s: %v; want ErrAgent", p, err)
		}
	}
}

// FuzzAnswer feeds arbitrary bytes as the agent's answer to every call:
// the client never panics, never hangs past its bounds, and only accepts
// well-formed answers.
func FuzzAnswer(f *testing.F) {
	var b bytes.Buffer
	wire.WriteJSON(&b, wire.TResult, wire.Ready{Nonce: "abc"})
	f.Add(b.Bytes())
	b.Reset()
	wire.WriteFrame(&b, wire.TStdout, []byte("hi\n"))
	wire.WriteJSON(&b, wire.TExit, wire.Exit{Code: 3})
	f.Add(b.Bytes())
	b.Reset()
	wire.WriteFrame(&b, wire.TData, []byte(`[{"name":"a","size":1,"mode":0,"mtime":0,"uid":0,"gid":0}]`))
	wire.WriteFrame(&b, wire.TEnd, nil)
	f.Add(b.Bytes())
	f.Add(header(wire.TError, 20))
	f.Fuzz(func(t *testing.T, ans []byte) {
		c := hostile(t, func(c net.Conn) { c.Write(ans) })
		c.CallTimeout = 200 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if n, err := c.Ready(ctx); err == nil && (n == "" || len(n) > MaxNonce) {
			t.Fatalf("accepted nonce %q", n)
		}
		if e, err := c.Exec(ctx, ExecRequest{Args: []string{"x"}}, Streams{Stdout: io.Discard, Stderr: io.Discard}); err == nil && (e.Code < -1 || e.Code > 255) {
			t.Fatalf("accepted exit %+v", e)
		}
		c.List(ctx, "/", nil)
		c.ReadFile(ctx, "/f", nil, 1<<16, io.Discard)
	})
}

// TestStreamIdleBound: a file stream whose agent stops (no next frame of a
// read, no intake of a write, no answer once a write was all sent) fails
// within StreamIdle, as an agent failure, though the caller set no
// deadline; what came before the stall was delivered.
func TestStreamIdleBound(t *testing.T) {
	const idle = 200 * time.Millisecond
	withIdle := func(c *Client) *Client { c.StreamIdle = idle; return c }
	stalled := func(before func(net.Conn)) *Client {
		return withIdle(hostile(t, func(c net.Conn) { before(c); time.Sleep(time.Hour) }))
	}
	ctx := context.Background()
	within := func(name string, start time.Time, err error, want string) {
		t.Helper()
		if took := time.Since(start); err == nil || !errors.Is(err, ErrAgent) || !strings.Contains(err.Error(), want) || took > 5*time.Second {
			t.Errorf("%s: err %v after %v, want ErrAgent ~%q within a few idle bounds", name, err, took, want)
		}
	}

	start := time.Now()
	_, err := stalled(func(net.Conn) {}).ReadFile(ctx, "/f", nil, 1<<20, io.Discard)
	within("read, silent agent", start, err, "nothing arrived for 200ms")

	var got bytes.Buffer
	start = time.Now()
	n, err := stalled(func(c net.Conn) { wire.WriteFrame(c, wire.TData, []byte("first")) }).ReadFile(ctx, "/f", nil, 1<<20, &got)
	within("read, stalled after a frame", start, err, "nothing arrived for 200ms")
	if n != 5 || got.String() != "first" {
		t.Errorf("read, stalled after a frame: %d bytes %q delivered, want the frame before the stall", n, got.String())
	}

	// hostile's agent drains what is sent and never answers.
	start = time.Now()
	_, err = stalled(func(net.Conn) {}).WriteFile(ctx, "/f", nil, 0o644, 1<<20, bytes.NewReader(make([]byte, 1<<20)))
	within("write, no answer", start, err, "nothing answered after the whole file was sent")

	// An agent that takes the request and nothing more: net.Pipe has no
	// buffer, so the first data frame waits for it.
	deaf := withIdle(&Client{Dial: func(context.Context) (net.Conn, error) {
		a, b := net.Pipe()
		go func() {
			defer b.Close()
			wire.ReadFrame(b, nil, 0)
			time.Sleep(time.Hour)
		}()
		return a, nil
	}})
	start = time.Now()
	_, err = deaf.WriteFile(ctx, "/f", nil, 0o644, 1<<20, bytes.NewReader(make([]byte, 1<<20)))
	within("write, agent takes nothing", start, err, "nothing taken for 200ms")

	// A caller's deadline shorter than the bound is the caller's own.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = (&Client{Dial: stalled(func(net.Conn) {}).Dial, StreamIdle: time.Hour}).ReadFile(cctx, "/f", nil, 1<<20, io.Discard)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "nothing arrived") {
		t.Errorf("read under the caller's shorter deadline: %v, want the caller's deadline", err)
	}
}

// symlinks answers a listing with n entries of 255-byte names and 4 KiB
// link targets (what a guest can really make), in full frames, counting
// the bytes it sent.
func symlinks(n int, sent *int64) func(net.Conn) {
	return func(c net.Conn) {
		e := wire.Stat{Name: strings.Repeat("n", MaxName), Link: strings.Repeat("l", MaxLink), Mode: 0o777}
		var batch []wire.Stat
		for i := 0; i < n; i++ {
			batch = append(batch, e)
			if len(batch) == 14 || i == n-1 { // 14 × ~4.4 KiB fits a frame
				p, _ := json.Marshal(batch)
				if wire.WriteFrame(c, wire.TData, p) != nil {
					return
				}
				*sent += int64(len(p))
				batch = batch[:0]
			}
		}
		wire.WriteFrame(c, wire.TEnd, nil)
	}
}

// A listing is bounded by bytes, not only entries: 20k symlinks with 4 KiB
// targets (under MaxList; ~87 MB on the wire) fail as too large once the
// budget is spent, and the client allocates a small multiple of its
// budget, not of the answer.
func TestHostileListByteBudget(t *testing.T) {
	var sent int64
	c := hostile(t, symlinks(20000, &sent))
	c.CallTimeout = 20 * time.Second
	const budget = 1 << 20
	c.ListBudget = budget
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	es, err := c.List(context.Background(), "/d", nil)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrListTooLarge) || errors.Is(err, ErrAgent) {
		t.Fatalf("list = %d entries, %v; want ErrListTooLarge", len(es), err)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("agent sent %d bytes before the client stopped; client allocated %d bytes (budget %d)", sent, alloc, budget)
	if alloc > 8*budget {
		t.Fatalf("allocated %d bytes for a listing with a budget of %d", alloc, budget)
	}
	// The default budget admits a big directory of ordinary names.
	sent = 0
	c = hostile(t, func(c net.Conn) {
		var batch []wire.Stat
		for i := 0; i < MaxList; i++ {
			batch = append(batch, wire.Stat{Name: fmt.Sprintf("file-%06d", i)})
			if len(batch) == 500 || i == MaxList-1 {
				p, _ := json.Marshal(batch)
				wire.WriteFrame(c, wire.TData, p)
				batch = batch[:0]
			}
		}
		wire.WriteFrame(c, wire.TEnd, nil)
	})
	c.CallTimeout = 20 * time.Second
	if es, err := c.List(context.Background(), "/d", nil); err != nil || len(es) != MaxList {
		t.Fatalf("list of %d short names: %d, %v", MaxList, len(es), err)
	}
}

// Names and link targets past NAME_MAX and PATH_MAX (or with a NUL) are a
// hostile agent's, in a listing and in a stat.
func TestHostileEntryLengths(t *testing.T) {
	for _, st := range []wire.Stat{
		{Name: strings.Repeat("n", MaxName+1)},
		{Name: "a", Link: strings.Repeat("l", MaxLink+1)},
		{Name: "a\x00b"},
		{Name: "a", Size: -1},
	} {
		c := hostile(t, func(c net.Conn) { wire.WriteJSON(c, wire.TData, []wire.Stat{st}); wire.WriteFrame(c, wire.TEnd, nil) })
		if _, err := c.List(context.Background(), "/", nil); !errors.Is(err, ErrAgent) {
			t.Errorf("list with %d-byte name, %d-byte link: %v; want ErrAgent", len(st.Name), len(st.Link), err)
		}
		c = hostile(t, func(c net.Conn) { wire.WriteJSON(c, wire.TResult, st) })
		if _, err := c.Stat(context.Background(), "/", nil); !errors.Is(err, ErrAgent) {
			t.Errorf("stat with %d-byte name, %d-byte link: %v; want ErrAgent", len(st.Name), len(st.Link), err)
		}
	}
	// At the limits: accepted.
	ok := wire.Stat{Name: strings.Repeat("n", MaxName), Link: strings.Repeat("l", MaxLink)}
	c := hostile(t, func(c net.Conn) { wire.WriteJSON(c, wire.TResult, ok) })
	if _, err := c.Stat(context.Background(), "/", nil); err != nil {
		t.Errorf("stat at the limits: %v", err)
	}
}

// A silent exec (an agent that says nothing, or a command that prints
// nothing and is fed nothing) ends at its idle bound with ErrIdle; output
// or input keeps it going.
func TestExecIdleBound(t *testing.T) {
	ctx := context.Background()
	c := hostile(t, func(c net.Conn) { time.Sleep(time.Hour) })
	start := time.Now()
	_, err := c.Exec(ctx, ExecRequest{Args: []string{"x"}, Idle: 200 * time.Millisecond}, Streams{})
	if !errors.Is(err, ErrIdle) || time.Since(start) > 5*time.Second {
		t.Fatalf("silent agent: %v after %v; want ErrIdle after ~200ms", err, time.Since(start))
	}
	// Output every 100 ms for 600 ms, then the exit: never idle.
	c = hostile(t, func(c net.Conn) {
		for range 6 {
			time.Sleep(100 * time.Millisecond)
			wire.WriteFrame(c, wire.TStdout, []byte("."))
		}
		wire.WriteJSON(c, wire.TExit, wire.Exit{Code: 3})
	})
	if e, err := c.Exec(ctx, ExecRequest{Args: []string{"x"}, Idle: 250 * time.Millisecond}, Streams{}); err != nil || e.Code != 3 {
		t.Fatalf("chatty exec: %+v, %v", e, err)
	}
	// Input every 100 ms counts too.
	c = hostile(t, func(c net.Conn) {
		time.Sleep(600 * time.Millisecond)
		wire.WriteJSON(c, wire.TExit, wire.Exit{Code: 4})
	})
	pr, pw := io.Pipe()
	go func() {
		for range 7 {
			time.Sleep(100 * time.Millisecond)
			pw.Write([]byte("x"))
		}
		pw.Close()
	}()
	if e, err := c.Exec(ctx, ExecRequest{Args: []string{"x"}, Idle: 250 * time.Millisecond}, Streams{Stdin: pr}); err != nil || e.Code != 4 {
		t.Fatalf("fed exec: %+v, %v", e, err)
	}
}

// The budget bounds the heap under concurrency too: 32 hostile listings
// at once (the node's --max-concurrent-streams default) each against a
// budget of 1 MiB keep the live heap within a small multiple of 32 MiB
// (docs/operations.md sizes ctld's MemoryMax from this).
func TestHostileListsConcurrentHeap(t *testing.T) {
	const n, budget = 32, 1 << 20
	var base runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)
	stop := make(chan struct{})
	peak := make(chan uint64)
	go func() {
		var m runtime.MemStats
		var p uint64
		for {
			select {
			case <-stop:
				peak <- p
				return
			case <-time.After(5 * time.Millisecond):
			}
			runtime.ReadMemStats(&m)
			p = max(p, m.HeapInuse)
		}
	}()
	errs := make(chan error, n)
	for range n {
		go func() {
			var sent int64
			c := hostile(t, symlinks(20000, &sent))
			c.CallTimeout, c.ListBudget = 30*time.Second, budget
			_, err := c.List(context.Background(), "/d", nil)
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; !errors.Is(err, ErrListTooLarge) {
			t.Errorf("list: %v; want ErrListTooLarge", err)
		}
	}
	close(stop)
	grew := int64(<-peak) - int64(base.HeapInuse)
	t.Logf("%d concurrent hostile listings, budget %d each: live heap grew by at most %d bytes", n, budget, grew)
	if grew > 4*n*budget {
		t.Fatalf("live heap grew by %d bytes, over 4 x %d budgets", grew, n)
	}
}
