package kernel_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/runsc"
	"github.com/ctld/ctld/internal/template"
)

// TestRunscGuestTCPOverVeth proves the VM runs a real gVisor guest with a
// sandbox network: a busybox container in a netns of ours, wired to the host
// by a veth pair, talks TCP both ways with a listener on the host end, and
// after delete nothing of it is left (container, processes, netns, links).
func TestRunscGuestTCPOverVeth(t *testing.T) {
	ktest.RequireBinary(t, "runsc")
	tmp := t.TempDir()
	runscRoot := filepath.Join(tmp, "runsc")
	ktest.CheckLeaks(t, ktest.SnapshotOptions{RunscRoots: []string{runscRoot}})

	const (
		id       = "kt-veth"
		hostLink = "ctldkt0"
		peerLink = "ctldkt1"
	)
	hostAddr, guestAddr := "10.200.0.1", "10.200.0.2"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	rootfs := filepath.Join(tmp, "rootfs")
	if err := template.BuildBusybox(rootfs, "/bin/busybox"); err != nil {
		t.Fatal(err)
	}
	ns := ktest.NewNetns(t)
	// veth: host end here with .1, peer in the netns with .2, both up.
	ktest.VethPair(t, ktest.Veth{Netns: netns.None(), Name: hostLink, Addr: hostAddr + "/30"}, ktest.Veth{Netns: ns.Handle, Name: peerLink, Addr: guestAddr + "/30"})

	ln, err := net.Listen("tcp", net.JoinHostPort(hostAddr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	type result struct {
		line, from string
		err        error
	}
	got := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- result{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Minute))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err == nil {
			_, err = c.Write([]byte("pong from host\n"))
		}
		got <- result{line: line, from: c.RemoteAddr().String(), err: err}
	}()

	r := &runsc.Runtime{Root: runscRoot, LogDir: filepath.Join(tmp, "logs")}
	// The build on PATH, as ctld records it (make RUNSC=current|debian).
	r.Version, _ = runsc.Version(context.Background(), "runsc")
	spec, err := runsc.BuildSpec(runsc.BundleSpec{
		ContainerID: id, RootPath: rootfs, Hostname: id, NetnsPath: ns.Path,
		PIDs: 64, MemoryBytes: 256 << 20, Args: []string{"sleep", "1000"},
	})
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(tmp, "bundle")
	if err := runsc.WriteBundle(bundle, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Delete(context.Background(), id); err != nil {
			t.Errorf("cleanup delete: %v", err)
		}
		if t.Failed() {
			for _, f := range []string{filepath.Join(r.ContainerLogDir(id), "runsc.log"), r.InitLogFile(id)} {
				b, _ := os.ReadFile(f)
				t.Logf("%s:\n%s", f, b)
			}
		}
	})
	if err := r.Create(ctx, id, bundle); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx, id); err != nil {
		t.Fatal(err)
	}

	var out, errb bytes.Buffer
	script := fmt.Sprintf("echo ping from guest | nc %s %d", hostAddr, port)
	code, err := r.Exec(ctx, id, runsc.ExecProcess{Args: []string{"sh", "-c", script}}, nil, &out, &errb)
	if err != nil || code != 0 {
		t.Fatalf("guest nc: code %d err %v stdout %q stderr %q", code, err, out.String(), errb.String())
	}
	select {
	case res := <-got:
		if res.err != nil {
			t.Fatalf("host side: %v", res.err)
		}
		if res.line != "ping from guest\n" {
			t.Errorf("host read %q", res.line)
		}
		if h, _, _ := net.SplitHostPort(res.from); h != guestAddr {
			t.Errorf("connection came from %s, want the guest's %s", res.from, guestAddr)
		}
	case <-ctx.Done():
		t.Fatal("host side never got a connection")
	}
	if out.String() != "pong from host\n" {
		t.Errorf("guest read %q (stderr %q)", out.String(), errb.String())
	}

	if err := r.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	var detail string
	gone := false
	for i := 0; i < 50 && !gone; i++ {
		if gone, detail = r.CheckGone(ctx, id); !gone {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if !gone {
		t.Errorf("container not gone: %s", detail)
	}
	if ids, err := r.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("runsc list after delete = %q, %v", ids, err)
	}
	t.Logf("guest<->host TCP over veth %s:%s ok; %s", hostAddr, strconv.Itoa(port), detail)
}
