package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/pgtest"
)

// TestCLIOnPostgres: with --db postgres://... the operator commands and
// `serve` keep their records in PostgreSQL (a real server the test
// starts), and the records are there, not in a SQLite file.
func TestCLIOnPostgres(t *testing.T) {
	srv := pgtest.Start(t)
	e := newEnv(t)
	e.db = srv.NewDatabase(t)

	out := e.ok("sandbox", "create", "sb1", "--cpu", "0.5", "--memory", "512Mi", "--", "sleep", "infinity")
	if !strings.Contains(out, "sandbox sb1 ready: generation 1") {
		t.Fatalf("create output:\n%s", out)
	}
	if out := e.ok("sandbox", "get", "sb1"); !strings.Contains(out, "recorded:   ready, generation 1, node node-a") {
		t.Fatalf("get output:\n%s", out)
	}
	out = e.ok("sandbox", "destroy", "sb1")
	m := regexp.MustCompile(`proof (op-[0-9a-f]+) verified: sb1 generation 1 is gone`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("destroy output:\n%s", out)
	}
	if out := e.ok("proof", "verify", m[1]); !strings.Contains(out, "verified") {
		t.Fatalf("proof verify output:\n%s", out)
	}

	key := strings.TrimSpace(e.ok("key", "create", "--owner", "team-a"))
	e.ok("owner", "quota", "set", "team-a", "--sandboxes", "1")
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	var errb strings.Builder
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--socket", e.socket, "--db", e.db, "serve", "--listen", "127.0.0.1:0"}, strings.NewReader(""), pw, &errb, func(string) string { return "" })
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("serve printed nothing: %v", err)
	}
	go io.Copy(io.Discard, pr)
	c := &client.Client{BaseURL: strings.TrimSpace(strings.TrimPrefix(line, "serving on ")), Key: key}
	sb, err := c.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil || sb.State != client.StateReady {
		t.Fatalf("create = %+v, %v", sb, err)
	}
	if _, err := c.Create(ctx, client.CreateRequest{Template: "busybox"}); err == nil || !strings.Contains(err.Error(), "quota_exceeded") {
		t.Fatalf("second create over a quota of 1: %v", err)
	}
	// The database restarted under the server: calls are 503
	// unavailable with a retry hint meanwhile, and work after it.
	srv.Stop(t)
	for what, call := range map[string]func() error{
		"get":    func() error { _, err := c.Get(ctx, sb.ID); return err },
		"create": func() error { _, err := c.Create(ctx, client.CreateRequest{Template: "busybox"}); return err },
	} {
		var ce *client.Error
		if err := call(); !errors.As(err, &ce) || ce.Status != 503 || ce.Code != "unavailable" || ce.RetryAfter < time.Second {
			t.Errorf("%s while the database is down: %v, want 503 unavailable with Retry-After", what, err)
		}
	}
	srv.Restart(t)
	if d, err := c.Destroy(ctx, sb.ID); err != nil || !d.Proof.Verified {
		t.Fatalf("destroy = %+v, %v", d, err)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("serve exited %d: %s", code, errb.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop")
	}
	if !strings.Contains(errb.String(), "backend=postgres") {
		t.Fatalf("serve's log does not say it runs on postgres:\n%s", errb.String())
	}

	// The records are in PostgreSQL.
	pc, err := pgx.Connect(context.Background(), e.db)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(context.Background())
	var sandboxes, proofs, owned int
	if err := pc.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM sandboxes), (SELECT count(*) FROM proofs WHERE verified = 1), (SELECT count(*) FROM owned_sandboxes WHERE active = 0)`).
		Scan(&sandboxes, &proofs, &owned); err != nil {
		t.Fatal(err)
	}
	if sandboxes != 2 || proofs != 2 || owned != 1 {
		t.Fatalf("in PostgreSQL: %d sandboxes, %d verified proofs, %d ended owned sandboxes; want 2, 2, 1", sandboxes, proofs, owned)
	}
	if _, err := os.Stat(e.db); !os.IsNotExist(err) {
		t.Fatalf("a file named like the URL exists: %v", err)
	}
}
