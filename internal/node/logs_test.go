package node

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/guestlog"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/runsc"
	"github.com/ctld/ctld/internal/testutil"
)

func logsNode(t *testing.T, state journal.State) (*Node, *guestlog.Ring) {
	t.Helper()
	n := testNode(t)
	n.d.Guest.Runtime = &runsc.Runtime{Root: filepath.Join(t.TempDir(), "runsc")}
	n.guest = n.newGuest()
	rec := journal.Sandbox{ID: "sb", Generation: 2, State: state, ContainerID: "sb-g2"}
	if err := n.d.Journal.Update(func(tx *journal.Tx) error { return tx.PutSandbox(rec) }); err != nil {
		t.Fatal(err)
	}
	if err := (guestlog.Dirs{Root: n.d.Guest.Runtime.LogRoot()}).Make("sb-g2"); err != nil {
		t.Fatal(err)
	}
	r := &guestlog.Ring{Dir: n.d.Guest.Runtime.ContainerLogDir("sb-g2"), Name: guestlog.InitName, Max: guestlog.MinMax}
	t.Cleanup(func() { r.Close() })
	return n, r
}

func TestLogsReadTailAndFollowUntilTheGenerationEnds(t *testing.T) {
	n, r := logsNode(t, journal.StateReady)
	r.Write([]byte("a\nb\nc\n"))
	var out bytes.Buffer
	end, err := n.Logs(context.Background(), "sb", LogsRequest{Tail: 2}, &out)
	if err != nil || out.String() != "b\nc\n" || end.Generation != 2 {
		t.Fatalf("tail 2: %q %+v %v", out.String(), end, err)
	}
	os.WriteFile(filepath.Join(n.d.Guest.Runtime.ContainerLogDir("sb-g2"), guestlog.RunscName), []byte("runsc says\n"), 0o600)
	out.Reset()
	if _, err := n.Logs(context.Background(), "sb", LogsRequest{Runsc: true}, &out); err != nil || out.String() != "runsc says\n" {
		t.Fatalf("runsc log: %q %v", out.String(), err)
	}

	var fout testutil.Buffer // written by Logs while the test reads it
	type result struct {
		end LogsEnd
		err error
	}
	res := make(chan result, 1)
	go func() {
		end, err := n.Logs(context.Background(), "sb", LogsRequest{Tail: 1, Follow: true, IdleSec: 60}, &fout)
		res <- result{end, err}
	}()
	time.Sleep(300 * time.Millisecond)
	r.Write([]byte("d\n"))
	for deadline := time.Now().Add(5 * time.Second); fout.String() != "c\nd\n"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("followed %q, want c and the new line d", fout.String())
		}
	}
	n.setState("sb", journal.StateReleasing, "")
	select {
	case got := <-res:
		if got.err != nil || got.end.Reason != "generation 2 ended (releasing)" {
			t.Fatalf("follow ended with %+v, %v", got.end, got.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("follow did not end when the generation did")
	}
	// Nothing to follow once the guest is gone; nothing at all once the
	// generation was released (its logs went with it).
	if _, err := n.Logs(context.Background(), "sb", LogsRequest{Follow: true, IdleSec: 1}, &out); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("follow of a releasing generation: %v, want conflict", err)
	}
	n.setState("sb", journal.StateReleased, "released")
	if _, err := n.Logs(context.Background(), "sb", LogsRequest{}, &out); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("logs of a released generation: %v, want not_found", err)
	}
}

func TestLogsFollowGivesUpWhenIdle(t *testing.T) {
	n, r := logsNode(t, journal.StateReady)
	r.Write([]byte("only line\n"))
	var out bytes.Buffer
	t0 := time.Now()
	end, err := n.Logs(context.Background(), "sb", LogsRequest{Follow: true, IdleSec: 1}, &out)
	if err != nil || out.String() != "only line\n" || !strings.Contains(end.Reason, "no output for 1s") {
		t.Fatalf("idle follow: %q %+v %v", out.String(), end, err)
	}
	if d := time.Since(t0); d < time.Second || d > 3*time.Second {
		t.Fatalf("idle follow took %v, want about 1s", d)
	}
}
