package writer

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
	"github.com/ctld/ctld/internal/cowdev"
	"github.com/ctld/ctld/internal/nbdsrv"
)

// ctlRig is a cowdev device over a dirstore template with the control
// socket served for it, as a writer has it (no kernel device).
type ctlRig struct {
	spec Spec
	repo *blockstore.Repo
	dev  *cowdev.Device
	ctl  *control
}

func newCtlRig(t *testing.T, sub string) *ctlRig {
	t.Helper()
	root := t.TempDir()
	ds, err := dirstore.Open(filepath.Join(root, "store"))
	if err != nil {
		t.Fatal(err)
	}
	nk, raw, err := blockstore.GenerateNodeKey("node-a")
	if err != nil {
		t.Fatal(err)
	}
	repo, err := blockstore.New(ds, nk, blockstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tpl := blockstore.GenRef{Volume: blockstore.Template("t"), Generation: 0}
	if _, err := repo.Commit(context.Background(), blockstore.CommitSpec{Generation: tpl, DeviceSize: 4 << 20}, nil); err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(root, "node.key")
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(raw)), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := Spec{Sandbox: "sb-1", Generation: 1, Epoch: 3, StoreDir: filepath.Join(root, "store"), NodeKeyFile: keyFile,
		NodeKeyID: "node-a", Base: tpl, Dir: filepath.Join(root, sub), Index: -1}
	if err := spec.Check(); err != nil {
		t.Fatal(err)
	}
	dev, err := cowdev.Open(context.Background(), cowdev.Config{Repo: repo, Base: tpl, Dir: spec.Dir, LocalStore: true})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(spec.Dir, SpecName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	ctl, err := listenControl(spec, dev, func() Stats {
		return Stats{PID: 7, Epoch: spec.Epoch, NBDErrors: nbdsrv.Errors{Read: 3}, Reconnects: 1}
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctl.stop(); _ = dev.Close() })
	return &ctlRig{spec: spec, repo: repo, dev: dev, ctl: ctl}
}

// exchange sends raw bytes to the control socket and returns the answer.
func (r *ctlRig) exchange(t *testing.T, req []byte) ctlAnswer {
	t.Helper()
	addr, done, err := ctlAddr(r.spec.Dir)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("unix", addr)
	done()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Write(req); err != nil {
		t.Fatal(err)
	}
	b, err := readLimited(conn, maxCtlAnswer)
	if err != nil {
		t.Fatal(err)
	}
	var a ctlAnswer
	if err := decodeStrict(b, &a); err != nil {
		t.Fatalf("answer %q: %v", b, err)
	}
	return a
}

// The control socket is the owner's only (0600); malformed, unknown,
// oversized or trailing-data requests are refused as invalid, a request
// of another epoch as stale, a generation not newer than the base as
// invalid; a good seal commits, is recorded in spec.json, and its
// generation asked for again is "exists". Stop removes the socket.
func TestControlRequests(t *testing.T) {
	r := newCtlRig(t, "w")
	path := filepath.Join(r.spec.Dir, CtlName)
	if fi, err := os.Stat(path); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("control socket: %v, %v; want a socket of mode 0600", fi.Mode(), err)
	}
	if _, err := r.dev.WriteAt(bytes.Repeat([]byte{7}, 100000), 12345); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ req, code string }{
		{"not json\n", codeInvalid},
		{`{"op":"seal","generation":1,"epoch":3,"extra":1}` + "\n", codeInvalid},
		{`{"op":"seal","generation":1,"epoch":3} {}` + "\n", codeInvalid},
		{`{"op":"seal","generation":1,"epoch":3}`, codeInvalid}, // cut short: the client closes without a newline
		{`{"op":"seal","generation":"1","epoch":3}` + "\n", codeInvalid},
		{`{"op":"unseal","generation":1,"epoch":3}` + "\n", codeInvalid},
		{`{"op":"seal","generation":1,"epoch":2}` + "\n", codeStale},
		{`{"op":"seal","generation":1,"epoch":4}` + "\n", codeStale},
	} {
		req := []byte(c.req)
		if !bytes.HasSuffix(req, []byte("\n")) {
			// A request cut short by the client's close.
			conn, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = conn.Write(req)
			_ = conn.(*net.UnixConn).CloseWrite()
			b, _ := readLimited(conn, maxCtlAnswer)
			_ = conn.Close()
			var a ctlAnswer
			if err := decodeStrict(b, &a); err != nil || a.Code != c.code {
				t.Fatalf("request %q: answer %q (%v), want code %q", c.req, b, err, c.code)
			}
			continue
		}
		if a := r.exchange(t, req); a.Code != c.code || a.Seal != nil {
			t.Fatalf("request %.60q: answer %+v, want code %q", c.req, a, c.code)
		}
	}
	// Oversized: refused, or the connection reset (the writer closed it
	// with the rest unread) before the answer was read.
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write([]byte(strings.Repeat(" ", maxCtlRequest+10) + `{"op":"seal","generation":1,"epoch":3}` + "\n"))
	b, err := readLimited(conn, maxCtlAnswer)
	_ = conn.Close()
	var big ctlAnswer
	if err == nil {
		err = decodeStrict(b, &big)
	}
	if (err != nil || big.Code != codeInvalid) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("oversized request: answer %q, %v; want code %q or a reset", b, err, codeInvalid)
	}
	if gens, err := r.repo.Generations(context.Background(), blockstore.Sandbox("sb-1")); err != nil || len(gens) != 0 {
		t.Fatalf("generations after refused requests: %v, %v", gens, err)
	}

	a := r.exchange(t, []byte(`{"op":"seal","generation":1,"epoch":3}`+"\n"))
	want := blockstore.GenRef{Volume: blockstore.Sandbox("sb-1"), Generation: 1}
	if a.Seal == nil || a.Seal.Ref != want || a.Seal.Parent != r.spec.Base || a.Seal.DataChunks != 2 || a.Seal.Chunks != 2 {
		t.Fatalf("seal answer %+v (seal %+v), want %s over %s with 2 data chunks", a, a.Seal, want, r.spec.Base)
	}
	if spec, err := readSpec(filepath.Join(r.spec.Dir, SpecName)); err != nil || spec.Base != want {
		t.Fatalf("spec.json after the seal: base %s, %v; want %s", spec.Base, err, want)
	}
	if a := r.exchange(t, []byte(`{"op":"seal","generation":1,"epoch":3}`+"\n")); a.Code != codeInvalid {
		t.Fatalf("seal as the base's generation: %+v, want code %q", a, codeInvalid)
	}
	if _, err := r.repo.Commit(context.Background(), blockstore.CommitSpec{Generation: blockstore.GenRef{Volume: want.Volume, Generation: 2}, Parent: &want, DeviceSize: 4 << 20}, nil); err != nil {
		t.Fatal(err)
	}
	if a := r.exchange(t, []byte(`{"op":"seal","generation":2,"epoch":3}`+"\n")); a.Code != codeExists {
		t.Fatalf("seal as an existing generation: %+v, want code %q", a, codeExists)
	}
	r.ctl.stop()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("control socket after stop: %v", err)
	}
}

// Supervisor.Seal of a dir with no writer is ErrNotRunning.
func TestSupervisorSealNotRunning(t *testing.T) {
	root := t.TempDir()
	s := &Supervisor{Root: root}
	if _, err := s.Seal(context.Background(), filepath.Join(root, "sb-1"), SealRequest{Generation: 1, Epoch: 1}); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Seal with no writer: %v, want ErrNotRunning", err)
	}
}

// A dir whose control socket's path is too long for a sockaddr_un is
// served and dialed through a descriptor of the dir; stop removes the
// socket all the same.
func TestControlLongDir(t *testing.T) {
	r := newCtlRig(t, strings.Repeat("d", 120))
	path := filepath.Join(r.spec.Dir, CtlName)
	if len(path) <= maxCtlPath {
		t.Fatalf("path %d bytes: not long enough for this test", len(path))
	}
	if a := r.exchange(t, []byte(`{"op":"seal","generation":1,"epoch":3}`+"\n")); a.Seal == nil || a.Seal.Ref.Generation != 1 {
		t.Fatalf("seal through a long dir's socket: %+v", a)
	}
	r.ctl.stop()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("control socket after stop: %v", err)
	}
}
