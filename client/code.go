package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// CodeRequest runs a snippet of source in a language the sandbox's
// template serves (Template.Languages): python, node, bash or sh.
type CodeRequest struct {
	Language   string            `json:"language"`
	Source     string            `json:"source"`
	Stdin      []byte            `json:"stdin,omitempty"` // base64 in JSON
	Env        map[string]string `json:"env,omitempty"`
	Cwd        string            `json:"cwd,omitempty"`
	TimeoutSec int64             `json:"timeout_sec,omitempty"`
	User       *User             `json:"user,omitempty"`
}

// Code runs a snippet and returns its whole result (each output capped
// as exec's).
func (c *Client) Code(ctx context.Context, id string, r CodeRequest, opts ...Option) (ExecResult, error) {
	var res ExecResult
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "/code"), nil, r, &res, opts...)
	return res, err
}

// CodeStream runs a snippet, streaming its output to stdout and stderr
// as it comes (exec's events), and returns its exit code.
func (c *Client) CodeStream(ctx context.Context, id string, r CodeRequest, stdout, stderr io.Writer, opts ...Option) (int, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("encode request: %w", err)
	}
	opts = append(opts, func(r *http.Request) { r.Header.Set("Accept", "text/event-stream") })
	resp, err := c.Do(ctx, http.MethodPost, sandboxPath(id, "/code"), nil, bytes.NewReader(b), "application/json", opts...)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return ReadExecEvents(resp.Body, stdout, stderr)
}
