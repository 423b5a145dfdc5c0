package fakenode

import (
	"bytes"
	"io"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// interpreters run a script file of the guest, or "-": the script on
// stdin (the code call's shapes).
var interpreters = map[string]bool{"sh": true, "bash": true, "python3": true, "node": true}

// script runs req when it is an interpreter over a file of the guest:
// each line of the file is one of the fake's commands (split on spaces),
// in order, sharing stdin, until one exits non-zero (the script's code).
// "sleep N" past req's timeout ends the run as timed out (after the
// timeout). ok is false when req is not such a run.
func (n *Node) script(id string, req api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (x api.ExecExit, ok bool) {
	if len(req.Args) != 2 || !interpreters[path.Base(req.Args[0])] {
		return x, false
	}
	var src []byte
	if req.Args[1] == "-" {
		// The program on stdin, read whole first (python3 -, node -).
		src, _ = io.ReadAll(stdin)
		stdin = bytes.NewReader(nil)
	} else {
		n.mu.Lock()
		b, found := n.files[fsKey(id, req.Args[1])]
		n.mu.Unlock()
		if !found {
			return x, false
		}
		src = b
	}
	for _, line := range strings.Split(string(src), "\n") {
		args := strings.Fields(line)
		if len(args) == 0 {
			continue
		}
		if args[0] == "sleep" && len(args) == 2 && req.TimeoutSec > 0 {
			if d, _ := strconv.ParseInt(args[1], 10, 64); d > req.TimeoutSec {
				time.Sleep(time.Duration(req.TimeoutSec) * time.Second)
				return api.ExecExit{ExitCode: -1, Signal: 9, TimedOut: true}, true
			}
		}
		x := run(api.ExecRequest{Args: args, User: req.User}, &termState{}, stdin, stdout, stderr)
		if x.ExitCode != 0 {
			return x, true
		}
	}
	return api.ExecExit{}, true
}

// execScript is script for Exec: a timeout is the node's error.
func (n *Node) execScript(id string, req api.ExecRequest, stdout, stderr io.Writer) (int, bool, error) {
	x, ok := n.script(id, req, bytes.NewReader(req.Stdin), stdout, stderr)
	if x.TimedOut {
		return -1, ok, errdefs.Errorf(errdefs.CodeUnavailable, "exec in %s: timed out after %v", id, time.Duration(req.TimeoutSec)*time.Second)
	}
	return x.ExitCode, ok, nil
}
