package service

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/snippet"
)

// code runs a snippet in a language the sandbox's template serves, as
// exec runs a command: one JSON result, or an event stream.
func (s *Server) code(w http.ResponseWriter, r *http.Request, owner string) error {
	o, err := s.owned(r, owner)
	if err != nil {
		return err
	}
	var req client.CodeRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	env, err := runEnv(req.TimeoutSec, req.Env)
	if err != nil {
		return err
	}
	if _, err := snippet.Lookup(req.Language); err != nil {
		return err
	}
	var rec record
	if err := json.Unmarshal(o.Spec, &rec); err != nil {
		return fmt.Errorf("decode the spec of %s: %w", o.ID, err)
	}
	tname := rec.Spec.RootFS.Template
	t, ok := s.template(tname)
	if !ok {
		return invalidf("the sandbox's template %s is no longer offered here: its languages are unknown", errdefs.Quote(tname))
	}
	if err := snippet.CheckServed(req.Language, tname, t.Languages); err != nil {
		return err
	}
	sreq := snippet.Request{Language: req.Language, Source: []byte(req.Source), Stdin: req.Stdin, Env: env, Cwd: req.Cwd,
		TimeoutSec: req.TimeoutSec, User: userOf(req.User)}
	if _, err := snippet.NewPlan(sreq, "/tmp", "check"); err != nil {
		return err
	}
	return s.answerRun(w, r, func(stdout, stderr io.Writer) (int, error) {
		return snippet.Runner{Guest: s.Manager, Log: s.log()}.Run(r.Context(), o.ID, sreq, stdout, stderr)
	})
}

// runEnv checks what exec and code share of a request, its timeout's
// bound and its env, and returns the env as a list.
func runEnv(timeoutSec int64, env map[string]string) ([]string, error) {
	if timeoutSec < 0 || time.Duration(timeoutSec)*time.Second > maxExecTimeout {
		return nil, invalidf("timeout_sec must be between 0 and %d", int64(maxExecTimeout/time.Second))
	}
	return envList(env)
}

// answerRun answers an exec or code call: run's output as one JSON result
// (each stream capped), or as an event stream when the caller accepts
// one: stdout and stderr events as output comes, then exit or error.
func (s *Server) answerRun(w http.ResponseWriter, r *http.Request, run func(stdout, stderr io.Writer) (int, error)) error {
	if !strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		limit := orDefault(s.MaxBodyBytes, DefaultMaxBodyBytes)
		stdout, stderr := &capped{limit: limit}, &capped{limit: limit}
		code, err := run(stdout, stderr)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, client.ExecResult{ExitCode: code, Stdout: stdout.b, Stderr: stderr.b, StdoutTruncated: stdout.cut, StderrTruncated: stderr.cut})
		return nil
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	e := &sse{w: w, rc: http.NewResponseController(w)}
	code, err := run(sseStream{e, client.EventStdout}, sseStream{e, client.EventStderr})
	if err != nil {
		c, msg, _ := classify(err)
		b, _ := json.Marshal(client.ErrorBody{Error: client.ErrorDetail{Code: c, Message: msg}})
		e.event(client.EventError, b)
		return nil
	}
	b, _ := json.Marshal(client.ExecExit{ExitCode: code})
	e.event(client.EventExit, b)
	return nil
}
