// Command hostileagent is an e2e test's stand-in for a guest agent taken
// over by the guest: run as root inside a runsc guest, it listens on the
// agent's socket path once the test freed it and answers every call badly. How is
// read from a file at each connection, so one run serves every mode:
//
//	garbage  a frame type no agent sends, then random bytes
//	huge     up to 10 GiB of output (stdout frames to an exec, data frames to
//	         anything else), as fast as the caller takes it
//	silent   reads the request and never answers (holds the connection)
//	flood    huge, but a listing is an endless run of valid entries (names
//	         of 255 bytes, link targets of 4096), so only the caller's
//	         budget ends it
//
// Build it static (CGO_ENABLED=0): it runs in the busybox template.
//
//	hostileagent SOCKET MODEFILE
package main

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/agent/wire"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: hostileagent SOCKET MODEFILE")
		os.Exit(2)
	}
	sock, modeFile := os.Args[1], os.Args[2]
	// The real agent still runs, but gVisor does not let the guest unlink
	// its socket (a host file): the test removes it on the host, and this
	// listens as soon as the name is free. Callers reach this one then.
	var l net.Listener
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if l, err = net.Listen("unix", sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "hostileagent:", err)
			os.Exit(1)
		}
	}
	fmt.Println("hostileagent: listening on", sock)
	for {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "hostileagent:", err)
			os.Exit(1)
		}
		b, _ := os.ReadFile(modeFile)
		go serve(c, strings.TrimSpace(string(b)))
	}
}

func serve(c net.Conn, mode string) {
	defer c.Close()
	_, p, err := wire.ReadFrame(c, nil, wire.MaxPayload)
	if err != nil {
		return
	}
	var req wire.Request
	_ = wire.Decode(p, &req) // a bad request is answered as badly
	switch {
	case mode == "flood" && req.Op == wire.OpList:
		e := wire.Stat{Name: strings.Repeat("n", 255), Link: strings.Repeat("l", 4096), Mode: 0o777}
		batch := make([]wire.Stat, 14) // 14 x ~4.4 KiB fits a frame
		for i := range batch {
			batch[i] = e
		}
		p, _ := json.Marshal(batch)
		var sent int64
		for wire.WriteFrame(c, wire.TData, p) == nil {
			sent += int64(len(p))
		}
		fmt.Printf("hostileagent: listing ended after %d bytes\n", sent)
	case mode == "huge" || mode == "flood":
		t := wire.TData
		if req.Op == wire.OpExec {
			t = wire.TStdout
		}
		chunk := make([]byte, wire.MaxPayload)
		for sent := int64(0); sent < 10<<30; sent += int64(len(chunk)) {
			if wire.WriteFrame(c, t, chunk) != nil {
				return
			}
		}
	case mode == "silent":
		io.Copy(io.Discard, c) // until the caller gives up
	default: // garbage
		junk := make([]byte, 4096)
		rand.Read(junk)
		junk[0] = '?'
		c.Write(junk)
	}
}
