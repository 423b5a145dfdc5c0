package api

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
)

func TestReadExecStream(t *testing.T) {
	cases := []struct {
		name, in       string
		code           int
		stdout, stderr string
		errCode        errdefs.Code
		errMsg         string
	}{
		{"plain", "event: stdout\ndata: aGk=\n\nevent: exit\ndata: {\"exit_code\":5}\n\n", 5, "hi", "", "", ""},
		{"crlf and comments", ": keep-alive\r\n\r\nevent: stderr\r\ndata: b29wcw==\r\n\r\nevent: exit\r\ndata: {\"exit_code\":0}\r\n\r\n", 0, "", "oops", "", ""},
		{"unknown event skipped", "event: progress\ndata: 50\n\nevent: exit\ndata: {\"exit_code\":1}\n\n", 1, "", "", "", ""},
		{"error event", "event: stdout\ndata: YQ==\n\nevent: error\ndata: {\"code\":\"fenced\",\"message\":\"stale\"}\n\n", -1, "a", "", errdefs.CodeFenced, "stale"},
		{"no exit", "event: stdout\ndata: YQ==\n\n", -1, "a", "", errdefs.CodeUnavailable, "without an exit event"},
		{"cut mid-line", "event: stdout\ndata: YQ", -1, "", "", errdefs.CodeUnavailable, "unexpected EOF"},
		{"bad base64", "event: stdout\ndata: !!!\n\n", -1, "", "", errdefs.CodeInternal, "decode stdout event"},
		{"line too long", "event: stdout\ndata: " + strings.Repeat("A", maxSSELine+10) + "\n\n", -1, "", "", errdefs.CodeUnavailable, "longer than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code, err := readExecStream(strings.NewReader(c.in), &stdout, &stderr)
			if c.errCode != "" {
				if errdefs.CodeOf(err) != c.errCode || !strings.Contains(err.Error(), c.errMsg) {
					t.Fatalf("err = %v, want %s containing %q", err, c.errCode, c.errMsg)
				}
			} else if err != nil {
				t.Fatalf("readExecStream: %v", err)
			}
			if code != c.code || stdout.String() != c.stdout || stderr.String() != c.stderr {
				t.Errorf("got %d %q %q, want %d %q %q", code, stdout.String(), stderr.String(), c.code, c.stdout, c.stderr)
			}
		})
	}
}
