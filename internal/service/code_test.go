package service

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/snippet"
)

// TestCode runs snippets over real sockets against the fake node, whose
// interpreters run each line of the file as one of its commands.
func TestCode(t *testing.T) {
	tpls := append([]client.Template{{Name: "py", Mode: "overlay", Languages: []string{"python", "sh"}}}, testTemplates...)
	e := newEnv(t, func(s *Server) { s.Templates = tpls })
	ctx := context.Background()
	if got, err := e.a.Templates(ctx); err != nil || len(got) != 3 || strings.Join(got[0].Languages, ",") != "python,sh" {
		t.Fatalf("templates = %+v, %v", got, err)
	}
	sb, err := e.a.Create(ctx, client.CreateRequest{Template: "py"})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}

	// Prints, then fails: stdout, stderr and the exit code.
	res, err := e.a.Code(ctx, sb.ID, client.CodeRequest{Language: "python", Source: "echo hello\nfail 3 Traceback: boom\necho never"})
	if err != nil || res.ExitCode != 3 || string(res.Stdout) != "hello\n" || string(res.Stderr) != "Traceback: boom\n" {
		t.Fatalf("code = %+v, %v", res, err)
	}
	// Reads stdin; runs as the user asked for.
	res, err = e.a.Code(ctx, sb.ID, client.CodeRequest{Language: "sh", Source: "cat\nid", Stdin: []byte("in put\n"), User: &client.User{UID: 0, GID: 0}},
		client.IdempotencyKey("code-1"))
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "in put\nuid=0 gid=0\n" {
		t.Fatalf("code with stdin = %+v, %v", res, err)
	}
	// Streamed.
	var out, errb bytes.Buffer
	code, err := e.a.CodeStream(ctx, sb.ID, client.CodeRequest{Language: "python", Source: "echo out\nfail 0 err"}, &out, &errb)
	if err != nil || code != 0 || out.String() != "out\n" || errb.String() != "err\n" {
		t.Fatalf("code stream = %d %q %q, %v", code, out.String(), errb.String(), err)
	}
	// Past its timeout: exec's timeout error.
	_, err = e.a.Code(ctx, sb.ID, client.CodeRequest{Language: "python", Source: "sleep 30", TimeoutSec: 1})
	if errCode(err) != client.CodeUnavailable || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("code past its timeout: %v", err)
	}
	// The runs left nothing in the guest's /tmp.
	if ents, err := e.a.ListFiles(ctx, sb.ID, "/tmp"); err != nil || len(ents) != 0 {
		t.Fatalf("/tmp after the runs = %+v, %v", ents, err)
	}
	e.node.Lock()
	sessions := len(e.node.Sessions)
	e.node.Unlock()
	if sessions != 0 {
		t.Fatalf("code used %d sessions, want exec", sessions)
	}

	// Refused clearly: an unknown language, one the template does not
	// serve, a template with none, a source too large, a bad timeout.
	bad := []struct {
		name, id string
		req      client.CodeRequest
		code     string
		msg      string
		invalid  bool
	}{
		{"unknown language", sb.ID, client.CodeRequest{Language: "cobol", Source: "x"}, client.CodeInvalidArgument, "unknown language \"cobol\": one of bash, node, python, sh", true},
		{"not served", sb.ID, client.CodeRequest{Language: "node", Source: "x"}, client.CodeInvalidArgument, "template \"py\" serves python, sh, not node", false},
		{"template with none", plain.ID, client.CodeRequest{Language: "sh", Source: "x"}, client.CodeInvalidArgument, "serves no language", false},
		{"too large", sb.ID, client.CodeRequest{Language: "sh", Source: strings.Repeat("x", snippet.MaxSourceBytes+1)}, client.CodeInvalidArgument, "at most 262144", true},
		{"bad timeout", sb.ID, client.CodeRequest{Language: "sh", Source: "x", TimeoutSec: -1}, client.CodeInvalidArgument, "timeout_sec", true},
		{"bad env", sb.ID, client.CodeRequest{Language: "sh", Source: "x", Env: map[string]string{"1A": "x"}}, client.CodeInvalidArgument, "environment variable", false},
	}
	for _, c := range bad {
		cctx := ctx
		if c.invalid {
			cctx = invalid(ctx)
		}
		_, err := e.a.Code(cctx, c.id, c.req)
		if errCode(err) != c.code || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want %s with %q", c.name, err, c.code, c.msg)
		}
	}
	// Another owner's sandbox is not found.
	if _, err := e.b.Code(ctx, sb.ID, client.CodeRequest{Language: "sh", Source: "echo x"}); errCode(err) != client.CodeNotFound {
		t.Fatalf("team-b's code in team-a's sandbox: %v", err)
	}
}
