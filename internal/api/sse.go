package api

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
)

// Exec streams use server-sent events (text/event-stream):
//
//	event: stdout | stderr   data: base64 of a chunk of output
//	event: exit              data: ExecExit JSON, the last event
//	event: error             data: ErrorBody JSON, the last event
const (
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
	EventError  = "error"

	// ContentTypeSSE is the media type of event streams.
	ContentTypeSSE = "text/event-stream"

	// maxSSELine bounds one line the client accepts.
	maxSSELine = 1 << 20
)

// ExecExit is the data of the final "exit" event of an exec stream: how
// the command ended.
type ExecExit struct {
	ExitCode int  `json:"exit_code"`        // its status, or -1 when a signal ended it
	Signal   int  `json:"signal,omitempty"` // the signal that ended it
	TimedOut bool `json:"timed_out,omitempty"`
}

// readExecStream reads an exec event stream, copying output to stdout and
// stderr, until the exit or error event.
func readExecStream(r io.Reader, stdout, stderr io.Writer) (int, error) {
	code := -1
	err := readEvents(r, "exec", "an exit event", func(name string, data []byte) (bool, error) {
		c, done, err := dispatchEvent(name, data, stdout, stderr)
		if done {
			code = c
		}
		return done, err
	})
	return code, err
}

// readEvents reads an event stream and hands each event to fn until fn
// says it was the last one (or fails). A stream that ends before is an
// unavailable error naming the stream and the event it lacked.
func readEvents(r io.Reader, what, last string, fn func(name string, data []byte) (last bool, err error)) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var name string
	var data []byte
	for {
		line, err := readLine(br)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return &errdefs.Error{Code: errdefs.CodeUnavailable, Message: what + " stream ended without " + last, Cause: io.ErrUnexpectedEOF}
			}
			return &errdefs.Error{Code: errdefs.CodeUnavailable, Message: "read " + what + " stream: " + err.Error(), Cause: err}
		}
		switch {
		case len(line) == 0:
			if name == "" && data == nil {
				continue
			}
			last, err := fn(name, data)
			if last || err != nil {
				return err
			}
			name, data = "", nil
		case line[0] == ':':
			// comment (keep-alive)
		default:
			field, value, _ := bytes.Cut(line, []byte(":"))
			value = bytes.TrimPrefix(value, []byte(" "))
			switch string(field) {
			case "event":
				name = string(value)
			case "data":
				if data != nil {
					data = append(data, '\n')
				}
				data = append(data, value...)
			}
		}
	}
}

// readLine reads one line without its end, refusing lines over maxSSELine.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		line = append(line, frag...)
		if len(line) > maxSSELine {
			return nil, fmt.Errorf("event line longer than %d bytes", maxSSELine)
		}
		if err == nil {
			break
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) && len(line) > 0 {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	return bytes.TrimSuffix(line, []byte("\r")), nil
}

func dispatchEvent(name string, data []byte, stdout, stderr io.Writer) (code int, done bool, err error) {
	switch name {
	case EventStdout, EventStderr:
		out := stdout
		if name == EventStderr {
			out = stderr
		}
		chunk, err := base64.StdEncoding.DecodeString(string(data))
		if err != nil {
			return -1, true, &errdefs.Error{Code: errdefs.CodeInternal, Message: "decode " + name + " event: " + err.Error(), Cause: err}
		}
		if out != nil {
			if _, err := out.Write(chunk); err != nil {
				return -1, true, fmt.Errorf("write exec %s: %w", name, err)
			}
		}
		return 0, false, nil
	case EventExit:
		var x ExecExit
		if err := json.Unmarshal(data, &x); err != nil {
			return -1, true, &errdefs.Error{Code: errdefs.CodeInternal, Message: "decode exit event: " + err.Error(), Cause: err}
		}
		return x.ExitCode, true, nil
	case EventError:
		var b ErrorBody
		if err := json.Unmarshal(data, &b); err != nil || b.Code == "" {
			return -1, true, &errdefs.Error{Code: errdefs.CodeInternal, Message: fmt.Sprintf("exec stream error event: %s", data)}
		}
		return -1, true, &errdefs.Error{Code: b.Code, Message: b.Message, RetryAfter: time.Duration(b.RetryAfterSec) * time.Second}
	default:
		// Unknown events are skipped so the server may add some later.
		return 0, false, nil
	}
}
