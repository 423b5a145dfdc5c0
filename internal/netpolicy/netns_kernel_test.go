package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ktest"
)

// threadNetns returns the netns of every thread of this process.
func threadNetns(t *testing.T) map[string]string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, task := range tasks {
		ns, err := os.Readlink(filepath.Join("/proc/self/task", task.Name(), "ns/net"))
		if err != nil {
			continue // thread exited meanwhile
		}
		out[task.Name()] = ns
	}
	return out
}

func TestKernelNetnsLifecycle(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	n := &Netns{Prefix: "ctld-ktest-", Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
	ctx := context.Background()
	const name = "sb-net1"
	t.Cleanup(func() {
		if err := n.Delete(ctx, name); err != nil {
			t.Errorf("cleanup delete: %v", err)
		}
	})

	p, err := n.Create(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if p != "/run/netns/ctld-ktest-sb-net1" {
		t.Errorf("path = %q", p)
	}
	// Idempotent: same path, and still one mount, not two stacked.
	if p2, err := n.Create(ctx, name); err != nil || p2 != p {
		t.Fatalf("second Create = %q, %v", p2, err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if c := strings.Count(string(mi), " "+p+" "); c != 1 {
		t.Errorf("%s is mounted %d times, want 1", p, c)
	}
	// No thread of this process was left in the sandbox's netns. (Not
	// "every thread is in the host netns": a locked thread an earlier
	// test's netns helper left behind may sit in a netns of its own.)
	id, err := n.Identify(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for tid, ns := range threadNetns(t) {
		if ns == id.String() {
			t.Errorf("thread %s was left in the sandbox's netns %s", tid, ns)
		}
	}
	if names, err := n.List(ctx); err != nil || !reflect.DeepEqual(names, []string{name}) {
		t.Errorf("List = %v, %v; want [%s]", names, err, name)
	}

	links, routes, err := n.Describe(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(links, []string{"lo up"}) {
		t.Errorf("links = %v, want [lo up]", links)
	}
	if len(routes) == 0 {
		t.Error("no routes at all: lo is not up")
	}
	for _, r := range routes {
		if !strings.HasSuffix(r, " dev lo") || strings.HasPrefix(r, "main ") {
			t.Errorf("route %q: want only local-table routes on lo", r)
		}
	}
	t.Logf("routes: %v", routes)

	// Inside: loopback works, everything else has no route.
	err = runIn(p, func() error {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		go func() {
			if c, err := ln.Accept(); err == nil {
				_, _ = c.Write([]byte("hi"))
				c.Close()
			}
		}()
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			t.Errorf("dial loopback listener inside netns: %v", err)
		} else {
			buf := make([]byte, 2)
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(buf); err != nil || string(buf) != "hi" {
				t.Errorf("read from loopback peer = %q, %v", buf, err)
			}
			c.Close()
		}
		for _, addr := range []string{"10.0.2.2:80", "1.1.1.1:443", "169.254.169.254:80", "[2001:db8::1]:80", "[fd00:ec2::254]:80"} {
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err == nil {
				c.Close()
				t.Errorf("dial %s from inside the netns succeeded", addr)
				continue
			}
			if !errors.Is(err, unix.ENETUNREACH) {
				t.Errorf("dial %s = %v, want network unreachable", addr, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The proof must not pass while the namespace is still there.
	if ok, _ := n.CheckGone(ctx, name, NSID{}); ok {
		t.Error("CheckGone = true while the netns exists")
	}

	for i := 0; i < 2; i++ {
		if err := n.Delete(ctx, name); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	if ok, detail := n.CheckGone(ctx, name, NSID{}); !ok {
		t.Errorf("CheckGone after Delete = false: %s", detail)
	}
	if names, err := n.List(ctx); err != nil || len(names) != 0 {
		t.Errorf("List after Delete = %v, %v; want none", names, err)
	}
}

// A plain file left by an interrupted Create (crash between creating the
// file and mounting) is mounted over, not treated as a namespace.
func TestKernelNetnsCreateOverLeftoverFile(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	n := &Netns{Dir: t.TempDir(), Prefix: "ctld-ktest-"}
	ctx := context.Background()
	const name = "sb-left"
	t.Cleanup(func() {
		if err := n.Delete(ctx, name); err != nil {
			t.Errorf("cleanup delete: %v", err)
		}
	})
	if err := os.WriteFile(n.Path(name), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Create(ctx, name); err != nil {
		t.Fatal(err)
	}
	if is, err := isNetnsFile(n.Path(name)); err != nil || !is {
		t.Fatalf("after Create over a leftover file: nsfs = %v, %v", is, err)
	}
	if links, _, err := n.Describe(ctx, name); err != nil || !reflect.DeepEqual(links, []string{"lo up"}) {
		t.Errorf("Describe = %v, %v; want [lo up]", links, err)
	}
	if err := n.Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	if ok, detail := n.CheckGone(ctx, name, NSID{}); !ok {
		t.Errorf("CheckGone = false: %s", detail)
	}
}

// A different kind of namespace mounted at the path is a conflict: Create
// neither returns it as a netns nor mounts over it.
func TestKernelNetnsCreateRefusesOtherNamespace(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	n := &Netns{Dir: t.TempDir(), Prefix: "ctld-ktest-"}
	ctx := context.Background()
	const name = "sb-uts"
	p := n.Path(name)
	t.Cleanup(func() {
		if err := n.Delete(ctx, name); err != nil {
			t.Errorf("cleanup delete: %v", err)
		}
	})
	if err := os.WriteFile(p, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("/proc/self/ns/uts", p, "none", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	_, err := n.Create(ctx, name)
	if errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Errorf("Create over a uts namespace = %v, want conflict", err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if c := strings.Count(string(mi), " "+p+" "); c != 1 {
		t.Errorf("%s is mounted %d times, want 1 (the uts bind only)", p, c)
	}
}

// Removing the name does not end a namespace a process still holds: a
// thread in it, an open fd to it, or an nsfs bind mount of it elsewhere.
// The proof checks the namespace by inode and cookie and names the holder.
func TestKernelNetnsCheckGoneSeesHolders(t *testing.T) {
	ktest.Require(t)
	ktest.RequireBinary(t, "nsenter")
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	n := &Netns{Prefix: "ctld-ktest-", Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
	ctx := context.Background()
	const name = "sb-held"
	t.Cleanup(func() {
		if err := n.Delete(ctx, name); err != nil {
			t.Errorf("cleanup delete: %v", err)
		}
	})
	p, err := n.Create(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	id, err := n.Identify(ctx, name)
	if err != nil || !id.Known() || id.Cookie == 0 {
		t.Fatalf("Identify = %+v, %v; want inode and cookie", id, err)
	}
	// Holder 1: a process inside the namespace.
	sleeper := exec.Command("nsenter", "--net="+p, "sleep", "1000")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", sleeper.Process.Pid)); ns == id.String() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("nsenter did not enter the namespace within 10s")
		}
	}
	// Holder 2: an nsfs bind mount of it at another path.
	bind := filepath.Join(t.TempDir(), "netns-bind")
	if err := os.WriteFile(bind, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(p, bind, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bind, unix.MNT_DETACH) })
	// Holder 3: an open fd in this process.
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	if err := n.Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	ok, detail := n.CheckGone(ctx, name, id)
	for _, want := range []string{
		fmt.Sprintf("pid %d (task %d ns/net; ", sleeper.Process.Pid, sleeper.Process.Pid),
		"mounted at " + bind,
		fmt.Sprintf("pid %d (fd %d; ", os.Getpid(), f.Fd()),
	} {
		if ok || !strings.Contains(detail, want) {
			t.Errorf("CheckGone with holders = %v, %q; want false, naming %q", ok, detail, want)
		}
	}
	_ = sleeper.Process.Kill()
	_ = sleeper.Wait()
	if err := unix.Unmount(bind, 0); err != nil {
		t.Fatal(err)
	}
	if ok, detail := n.CheckGone(ctx, name, id); ok || !strings.Contains(detail, "(fd ") {
		t.Errorf("CheckGone with an fd left = %v, %q; want false, naming the fd", ok, detail)
	}
	f.Close()
	if ok, detail := n.CheckGone(ctx, name, id); !ok {
		t.Errorf("CheckGone after every holder went = false: %s", detail)
	}
}

// A namespace that got a freed inode number is not the recorded one: the
// cookie tells them apart.
func TestKernelNetnsCheckGoneCookie(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	n := &Netns{Dir: t.TempDir(), Prefix: "ctld-ktest-"}
	ctx := context.Background()
	const name = "sb-new"
	t.Cleanup(func() {
		if err := n.Delete(ctx, name); err != nil {
			t.Errorf("cleanup delete: %v", err)
		}
	})
	if _, err := n.Create(ctx, name); err != nil {
		t.Fatal(err)
	}
	live, err := n.Identify(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	// An old generation's record with the same inode but another cookie.
	old := live
	old.Cookie++
	if ok, detail := n.CheckGone(ctx, "sb-old", old); !ok {
		t.Errorf("CheckGone of a namespace whose inode was reused = false: %s", detail)
	}
	if ok, _ := n.CheckGone(ctx, "sb-old", live); ok {
		t.Errorf("CheckGone with the live namespace's identity = true")
	}
}
