package apiserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

func testSandbox() api.Sandbox {
	return api.Sandbox{
		ID: "sb-1", Generation: 2, State: api.StateReady, ContainerID: "c-1", LeaseID: "l-1",
		Resources: api.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PIDs: 64, Cpuset: "0-1"},
		RootFS:    api.RootFS{Mode: api.RootFSOverlay, Template: "alpine"},
		Epoch:     7,
		CreatedAt: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
		Timings:   api.Timings{LeaseMS: 1.5, TotalMS: 2500},
		OOMKills:  1,
		Network:   &api.NetworkStatus{Mode: api.NetworkOpen, TxBytes: 1 << 40, TxPackets: 9, DroppedPackets: 2},
	}
}

func testProof() api.CleanupProof {
	return api.CleanupProof{
		OperationID: "op-2", NodeID: "n1", BootID: "b1", Epoch: 7, SandboxID: "sb-1", Generation: 2, LeaseID: "l-1",
		Checks: []api.ProofCheck{{Name: "cgroup_removed", OK: true}, {Name: "netns_removed", OK: true, Detail: "gone"}},
		Clean:  true, Time: time.Date(2026, 11, 29, 12, 1, 0, 0, time.UTC),
		NodeKey: []byte{1, 2, 3}, Signature: []byte{4, 5, 6},
	}
}

func TestClientRoundTrip(t *testing.T) {
	sb := testSandbox()
	fake := &fakeService{
		node: api.Node{NodeID: "n1", BootID: "b1", Slot: "a", Role: "primary", Epoch: 7,
			Versions: api.Versions{Kernel: "6.1"}, Capacity: api.NodeCapacity{Total: api.Capacity{CPUMillis: 2000}},
			Withheld: []api.WithheldLease{{SandboxID: "sb-0", Generation: 1, Reason: "cgroup busy"}}},
		claim:   api.ClaimResponse{Sandbox: sb},
		release: api.ReleaseResponse{Sandbox: sb, Proof: testProof()},
		list:    api.SandboxList{Sandboxes: []api.Sandbox{sb}},
		sandbox: sb,
		proof:   testProof(),
		file:    []byte("hello\x00world"),
		exec: func(stdout, stderr io.Writer) (int, error) {
			stdout.Write([]byte("out"))
			stderr.Write([]byte("err"))
			return 3, nil
		},
	}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
	c := &api.Client{SocketPath: srv.sock}
	ctx := context.Background()
	check := func(name string, got, want any, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %+v, want %+v", name, got, want)
		}
	}
	n, err := c.Node(ctx)
	check("Node", n, fake.node, err)
	claim, err := c.Claim(ctx, "sb-1", validClaim())
	check("Claim", claim, fake.claim, err)
	res, err := c.Exec(ctx, "sb-1", api.ExecRequest{Args: []string{"/bin/x"}})
	check("Exec", res, api.ExecResult{ExitCode: 3, Stdout: []byte("out"), Stderr: []byte("err")}, err)
	var stdout, stderr bytes.Buffer
	code, err := c.ExecStream(ctx, "sb-1", api.ExecRequest{Args: []string{"/bin/x"}}, &stdout, &stderr)
	check("ExecStream", []any{code, stdout.String(), stderr.String()}, []any{3, "out", "err"}, err)
	data, err := c.ReadFile(ctx, "sb-1", "/etc/a b?&.txt")
	check("ReadFile", data, fake.file, err)
	err = c.WriteFile(ctx, "sb-1", "/tmp/x", []byte("payload"))
	check("WriteFile", fake.written, []byte("payload"), err)
	rel, err := c.Release(ctx, "sb-1", api.ReleaseRequest{OperationID: "op-2", Generation: 2})
	check("Release", rel, fake.release, err)
	upd, err := c.UpdateNetwork(ctx, "sb-1", api.NetworkPolicy{Mode: api.NetworkOpen})
	check("UpdateNetwork", upd, sb, err)
	list, err := c.List(ctx)
	check("List", list, fake.list, err)
	got, err := c.Get(ctx, "sb-1")
	check("Get", got, sb, err)
	proof, err := c.Proof(ctx, "op-2")
	check("Proof", proof, fake.proof, err)

	want := []string{
		"Node",
		"Claim sb-1 op-1 gen=1",
		`Exec sb-1 ["/bin/x"]`,
		`Exec sb-1 ["/bin/x"]`,
		"ReadFileTo sb-1 /etc/a b?&.txt default limit=1073741824",
		"WriteFileFrom sb-1 /tmp/x default 0 limit=1073741824",
		"Release sb-1 op-2 gen=2",
		"UpdateNetwork sb-1 open 0 rules",
		"List",
		"Get sb-1",
		"Proof op-2",
	}
	if calls := fake.Calls(); !reflect.DeepEqual(calls, want) {
		t.Errorf("Service calls:\n%q\nwant\n%q", calls, want)
	}
}

func TestClientEmptyListIsNotNull(t *testing.T) {
	srv := startServer(t, &Server{Service: &fakeService{}, AllowedGID: -1})
	resp := rawDo(t, srv.sock, "GET", "/v1/sandboxes", nil, nil)
	if got := strings.TrimSpace(string(resp.body)); got != `{"sandboxes":[]}` {
		t.Errorf("empty list = %s, want {\"sandboxes\":[]}", got)
	}
}

func TestClientDecodesServerErrors(t *testing.T) {
	fake := &fakeService{}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
	c := &api.Client{SocketPath: srv.sock}
	ctx := context.Background()
	for _, svcErr := range []*errdefs.Error{
		errdefs.Errorf(errdefs.CodeNotFound, "sandbox %q not found", "sb-1"),
		errdefs.Errorf(errdefs.CodeCapacityExhausted, "need 4096 MiB, 512 MiB free"),
		errdefs.Errorf(errdefs.CodeFenced, "writer epoch 3 is stale"),
		errdefs.Errorf(errdefs.CodeNotPrimary, "this is slot b, standby"),
	} {
		fake.err = svcErr
		calls := map[string]func() error{
			"Node":  func() error { _, err := c.Node(ctx); return err },
			"Claim": func() error { _, err := c.Claim(ctx, "sb-1", validClaim()); return err },
			"Exec":  func() error { _, err := c.Exec(ctx, "sb-1", api.ExecRequest{Args: []string{"/x"}}); return err },
			"Stream": func() error {
				_, err := c.ExecStream(ctx, "sb-1", api.ExecRequest{Args: []string{"/x"}}, io.Discard, io.Discard)
				return err
			},
			"Read":  func() error { _, err := c.ReadFile(ctx, "sb-1", "/a"); return err },
			"Write": func() error { return c.WriteFile(ctx, "sb-1", "/a", nil) },
			"Release": func() error {
				_, err := c.Release(ctx, "sb-1", api.ReleaseRequest{OperationID: "o", Generation: 1})
				return err
			},
			"Network": func() error {
				_, err := c.UpdateNetwork(ctx, "sb-1", api.NetworkPolicy{Mode: api.NetworkDenyAll})
				return err
			},
			"List":  func() error { _, err := c.List(ctx); return err },
			"Get":   func() error { _, err := c.Get(ctx, "sb-1"); return err },
			"Proof": func() error { _, err := c.Proof(ctx, "op-1"); return err },
		}
		fake.exec = func(io.Writer, io.Writer) (int, error) { return -1, svcErr }
		for name, call := range calls {
			err := call()
			var e *errdefs.Error
			if !errors.As(err, &e) || e.Code != svcErr.Code || e.Message != svcErr.Message {
				t.Errorf("%s with Service error %v: got %#v, want *errdefs.Error{%s, %q}", name, svcErr, err, svcErr.Code, svcErr.Message)
			}
		}
	}
}

func TestClientExecStream(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 10<<10) // 160 KiB: several events
	cases := []struct {
		name       string
		exec       func(stdout, stderr io.Writer) (int, error)
		wantCode   int
		wantOut    string
		wantErr    string
		wantErrMsg errdefs.Code
	}{
		{"interleaved", func(o, e io.Writer) (int, error) {
			o.Write([]byte("a\n"))
			e.Write([]byte("warn\n"))
			o.Write([]byte("b\n"))
			return 0, nil
		}, 0, "a\nb\n", "warn\n", ""},
		{"large output", func(o, e io.Writer) (int, error) {
			o.Write(big)
			return 42, nil
		}, 42, string(big), "", ""},
		{"binary", func(o, e io.Writer) (int, error) {
			o.Write([]byte{0, 1, 2, '\n', '\r', 0xff})
			return 1, nil
		}, 1, "\x00\x01\x02\n\r\xff", "", ""},
		{"error before output", func(o, e io.Writer) (int, error) {
			return -1, errdefs.Errorf(errdefs.CodeNotFound, "no sandbox")
		}, -1, "", "", errdefs.CodeNotFound},
		{"error after output", func(o, e io.Writer) (int, error) {
			o.Write([]byte("partial"))
			return -1, errdefs.Errorf(errdefs.CodeUnavailable, "guest went away")
		}, -1, "partial", "", errdefs.CodeUnavailable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := startServer(t, &Server{Service: &fakeService{exec: c.exec}, AllowedGID: -1})
			var stdout, stderr bytes.Buffer
			code, err := (&api.Client{SocketPath: srv.sock}).ExecStream(context.Background(), "sb-1", api.ExecRequest{Args: []string{"/x"}}, &stdout, &stderr)
			if c.wantErrMsg != "" {
				if errdefs.CodeOf(err) != c.wantErrMsg {
					t.Errorf("err = %v, want code %s", err, c.wantErrMsg)
				}
			} else if err != nil {
				t.Fatalf("ExecStream: %v", err)
			}
			if code != c.wantCode || stdout.String() != c.wantOut || stderr.String() != c.wantErr {
				t.Errorf("got code %d stdout %.40q stderr %q, want %d %.40q %q", code, stdout.String(), stderr.String(), c.wantCode, c.wantOut, c.wantErr)
			}
		})
	}
}

// TestClientStreamConcurrentWriters: the Service may write stdout and
// stderr from two goroutines; no event may be torn.
func TestClientStreamConcurrentWriters(t *testing.T) {
	exec := func(o, e io.Writer) (int, error) {
		var wg sync.WaitGroup
		for _, w := range []io.Writer{o, e} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 200 {
					fmt.Fprintf(w, "line %d\n", i)
				}
			}()
		}
		wg.Wait()
		return 0, nil
	}
	srv := startServer(t, &Server{Service: &fakeService{exec: exec}, AllowedGID: -1})
	var stdout, stderr bytes.Buffer
	if _, err := (&api.Client{SocketPath: srv.sock}).ExecStream(context.Background(), "sb-1", api.ExecRequest{Args: []string{"/x"}}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for i := range 200 {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if stdout.String() != want.String() || stderr.String() != want.String() {
		t.Errorf("outputs differ from what was written:\nstdout %q\nstderr %q", stdout.String(), stderr.String())
	}
}

func TestClientRefusesBadIDsLocally(t *testing.T) {
	fake := &fakeService{}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
	c := &api.Client{SocketPath: srv.sock}
	ctx := context.Background()
	for _, id := range []string{"..", "../etc", "a/b", "a\x00", "é", strings.Repeat("a", 300)} {
		if _, err := c.Get(ctx, id); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument || !strings.Contains(err.Error(), "sandbox id") {
			t.Errorf("Get(%.20q) = %v, want invalid_argument naming the sandbox id", id, err)
		}
	}
	if _, err := c.Proof(ctx, "a/../b"); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Errorf("Proof(a/../b) = %v, want invalid_argument", err)
	}
	if calls := fake.Calls(); len(calls) != 0 {
		t.Errorf("Service called: %q", calls)
	}
}

func TestClientDialHook(t *testing.T) {
	srv := startServer(t, &Server{Service: &fakeService{node: api.Node{NodeID: "n1"}}, AllowedGID: -1})
	dials := 0
	c := api.Client{SocketPath: "/nonexistent/ignored.sock", Dial: func(ctx context.Context) (net.Conn, error) {
		dials++
		var d net.Dialer
		return d.DialContext(ctx, "unix", srv.sock)
	}}
	n, err := c.Node(context.Background())
	if err != nil || n.NodeID != "n1" || dials != 1 {
		t.Errorf("Node via Dial hook = %+v, %v after %d dials; want n1 after 1 dial", n, err, dials)
	}
}
