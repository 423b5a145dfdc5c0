package cowdev_test

// The device served through nbdsrv over a Unix socket and driven by NBD
// peers none of us wrote (qemu-io, nbdcopy), and a writer killed with
// SIGKILL after a flush.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
	"github.com/ctld/ctld/internal/cowdev"
	"github.com/ctld/ctld/internal/nbdsrv"
	"github.com/ctld/ctld/internal/nbdsrv/nbdtest"
	"github.com/ctld/ctld/internal/testutil"
)

// TestMain runs the crash test's writer when re-executed as it (a child
// run from TestMain, not a test that skips).
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		if err := crashChild(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const childEnv = "COWDEV_TEST_CHILD" // store root|node key hex|dirty dir|socket

// crashChild serves a device until it is killed.
func crashChild() error {
	parts := strings.Split(os.Getenv(childEnv), "|")
	if len(parts) != 4 {
		return fmt.Errorf("bad %s", childEnv)
	}
	repo, err := openRepo(parts[0], parts[1])
	if err != nil {
		return err
	}
	ctx := context.Background()
	d, err := cowdev.Open(ctx, cowdev.Config{Repo: repo, Base: abRef, Dir: parts[2]})
	if err != nil {
		return err
	}
	srv, err := nbdsrv.New(nbdsrv.Export{Name: "test", Backend: d}, nbdsrv.Options{})
	if err != nil {
		return err
	}
	l, err := net.Listen("unix", parts[3])
	if err != nil {
		return err
	}
	fmt.Println("ready")
	return srv.Serve(ctx, l)
}

func openRepo(root, keyHex string) (*blockstore.Repo, error) {
	ds, err := dirstore.Open(root)
	if err != nil {
		return nil, err
	}
	key, err := hex.DecodeString(keyHex)
	if err != nil {
		return nil, err
	}
	nk, err := blockstore.NewNodeKey("node-a", key)
	if err != nil {
		return nil, err
	}
	return blockstore.New(ds, nk, blockstore.Options{})
}

func qemuIO(t testing.TB, uri string, cmds ...string) string {
	t.Helper()
	args := []string{"-f", "raw", "-d", "unmap"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	return nbdtest.Peer(t, "qemu-io", append(args, uri)...)
}

// fillBase commits a template whose every byte is 0xab.
func fillBase(t testing.TB, size int) *fixture {
	t.Helper()
	f := newFixture(t, 1) // a repo; its template is replaced below
	f.base = bytes.Repeat([]byte{0xab}, size)
	base := blockstore.GenRef{Volume: blockstore.Template("ab"), Generation: 0}
	commit(t, f.repo, blockstore.CommitSpec{Generation: base, DeviceSize: uint64(size), ChunkSize: cs}, f.base)
	return f
}

var abRef = blockstore.GenRef{Volume: blockstore.Template("ab"), Generation: 0}

// qemu-io's writes (with FUA), flush, discard and write-zeroes (with and
// without NO_HOLE), unaligned to chunks, read back right through NBD and
// in a re-opened device.
func TestQemuIOOverNBD(t *testing.T) {
	nbdtest.NeedPeers(t, "qemu-io")
	const size = 4 << 20
	f := fillBase(t, size)
	dir := t.TempDir()
	d := open(t, f, abRef, dir)
	uri := serve(t, d)
	out := qemuIO(t, uri,
		"read -P 0xab 0 4M",
		"write -P 0xcd 1000 100k",
		"write -f -P 0xce 1M 64k",
		"flush",
		"read -P 0xcd 1000 100k",
		"read -P 0xab 0 1000",
		"read -P 0xab 103400 10000",
		"read -P 0xce 1M 64k",
		"discard 2M 1M",
		"read -P 0 2M 1M",
		"discard 3200k 3000",
		"read -P 0 3200k 3000",
		"read -P 0xab 3279800 1",
		"write -z 3300k 20k",
		"read -P 0 3300k 20k",
		"write -z -u 3500k 100k",
		"read -P 0 3500k 100k",
		"read -P 0xab 4095k 1k",
		"flush",
	)
	if strings.Contains(out, "failed") || strings.Contains(out, "error") {
		t.Fatalf("qemu-io reported a failure:\n%s", out)
	}
	if n := strings.Count(out, "read "); n != 11 {
		t.Fatalf("qemu-io: %d reads reported, want 11:\n%s", n, out)
	}
	want := bytes.Clone(f.base)
	copy(want[1000:], bytes.Repeat([]byte{0xcd}, 100<<10))
	copy(want[1<<20:], bytes.Repeat([]byte{0xce}, 64<<10))
	clear(want[2<<20 : 3<<20])
	clear(want[3200<<10 : 3200<<10+3000])
	clear(want[3300<<10 : 3320<<10])
	clear(want[3500<<10 : 3600<<10])
	same(t, "device after qemu-io", readAll(t, d), want)
	same(t, "re-opened after qemu-io", readAll(t, open(t, f, abRef, dir)), want)
}

// nbdcopy (many requests in flight, several connections): the base comes
// out byte-identical; an image copied in with --flush comes out identical,
// also from a re-opened device.
func TestNbdcopyImageInImageOut(t *testing.T) {
	nbdtest.NeedPeers(t, "nbdcopy")
	f := newFixture(t, 600) // 9.4 MiB: zero chunks, half-zero chunks, data
	tmp := t.TempDir()
	dir := t.TempDir()
	d := open(t, f, tpl0, dir)
	uri := serve(t, d)
	out := filepath.Join(tmp, "out.img")
	nbdtest.Peer(t, "nbdcopy", uri, out)
	sameFile(t, out, f.base)

	img := pattern(int64(len(f.base)), 99)
	in := filepath.Join(tmp, "in.img")
	if err := os.WriteFile(in, img, 0o600); err != nil {
		t.Fatal(err)
	}
	nbdtest.Peer(t, "nbdcopy", "--flush", in, uri)
	nbdtest.Peer(t, "nbdcopy", "--connections=1", "--request-size=4096", uri, out)
	sameFile(t, out, img)
	same(t, "re-opened after nbdcopy", readAll(t, open(t, f, tpl0, dir)), img)
}

func sameFile(t testing.TB, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	same(t, path, got, want)
}

// One flipped byte in a stored object: qemu-io's read of that chunk gets
// an I/O error, never data; other chunks still read.
func TestTamperedObjectIsEIOOverNBD(t *testing.T) {
	nbdtest.NeedPeers(t, "qemu-io")
	f := fillBase(t, 1<<20)
	var objs []string
	_ = filepath.WalkDir(f.root, func(p string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() && strings.Contains(p, "templates/ab/chunks/") {
			objs = append(objs, p)
		}
		return nil
	})
	if len(objs) != 1 { // every chunk is the same content: one object
		t.Fatalf("%d chunk objects, want 1", len(objs))
	}
	b, err := os.ReadFile(objs[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-20] ^= 0x40
	if err := os.WriteFile(objs[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	uri := serve(t, open(t, f, abRef, t.TempDir()))
	args := []string{"-f", "raw", "-c", "read -P 0xab 16k 16k", uri}
	o, _ := exec.Command("qemu-io", args...).CombinedOutput()
	if !strings.Contains(string(o), "Input/output error") {
		t.Fatalf("qemu-io read of a tampered chunk: want an I/O error, got:\n%s", o)
	}
	// A written chunk needs no object: it reads.
	out := qemuIO(t, uri, "write -P 0x11 0 16k", "read -P 0x11 0 16k")
	if strings.Contains(out, "failed") || strings.Contains(out, "error") {
		t.Fatalf("qemu-io on a written chunk:\n%s", out)
	}
}

// A writer killed with SIGKILL right after a flush: a re-open finds all
// the flushed data (writes, a discard, write-zeroes, partial chunks).
func TestKill9AfterFlushKeepsFlushedData(t *testing.T) {
	nbdtest.NeedPeers(t, "qemu-io")
	const size = 4 << 20
	f := fillBase(t, size)
	keyHex := writeNodeKey(t, f)
	dir := t.TempDir()
	sock := filepath.Join(testutil.SocketDir(t), "s")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+strings.Join([]string{f.root, keyHex, dir, sock}, "|"))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("child: %q, %v", line, err)
	}
	uri := "nbd+unix:///?socket=" + sock
	out := qemuIO(t, uri,
		"write -P 0x5a 0 1M",
		"write -P 0x5b 1500k 3000",
		"discard 2M 512k",
		"write -z 3M 10000",
		"flush",
	)
	if strings.Contains(out, "failed") || strings.Contains(out, "error") {
		t.Fatalf("qemu-io:\n%s", out)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed = true
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die of SIGKILL: %v", err)
	}
	want := bytes.Clone(f.base)
	copy(want, bytes.Repeat([]byte{0x5a}, 1<<20))
	copy(want[1500<<10:], bytes.Repeat([]byte{0x5b}, 3000))
	clear(want[2<<20 : 2<<20+512<<10])
	clear(want[3<<20 : 3<<20+10000])
	same(t, "re-opened after kill -9", readAll(t, open(t, f, abRef, dir)), want)
}

// writeNodeKey gives the fixture a node key the child can load: a new
// repo over the same store, with the template re-committed under it.
func writeNodeKey(t testing.TB, f *fixture) string {
	t.Helper()
	nk, key, err := blockstore.GenerateNodeKey("node-a")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	ds, err := dirstore.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if f.repo, err = blockstore.New(ds, nk, blockstore.Options{}); err != nil {
		t.Fatal(err)
	}
	f.root = root
	commit(t, f.repo, blockstore.CommitSpec{Generation: abRef, DeviceSize: uint64(len(f.base)), ChunkSize: cs}, f.base)
	return hex.EncodeToString(key)
}

// Block status through peers none of us wrote (libnbd's nbdinfo --map,
// QEMU's qemu-img map): chunks that are holes of the base, or trimmed,
// read as zeros without a fetch and are reported as holes that read as
// zeros; written chunks (also over a base hole) and base data are data.
func TestBlockStatusOverNBD(t *testing.T) {
	nbdtest.NeedPeers(t, "nbdinfo", "qemu-img")
	const n = 45
	f := newFixture(t, n) // chunks 0, 3, 6, ... are holes of the base
	d := open(t, f, tpl0, t.TempDir())
	if err := d.Trim(1*cs, cs); err != nil { // data → zero
		t.Fatal(err)
	}
	if _, err := d.WriteAt([]byte{1}, 3*cs+5); err != nil { // hole → data
		t.Fatal(err)
	}
	if err := d.WriteZeroes(7*cs, 2*cs, false); err != nil { // data → zero
		t.Fatal(err)
	}
	zero := make([]bool, n)
	for i := range n {
		zero[i] = bytes.Equal(f.base[i*cs:(i+1)*cs], make([]byte, cs))
	}
	zero[1], zero[3], zero[7], zero[8] = true, false, true, true
	if !zero[0] || zero[2] {
		t.Fatal("fixture: chunk 0 should be a hole and chunk 2 data")
	}
	uri := serve(t, d)
	check := func(peerName string, exts []struct {
		off, n int64
		zero   bool
	}) {
		t.Helper()
		at := int64(0)
		for _, e := range exts {
			if e.off != at || e.n <= 0 {
				t.Fatalf("%s: extent at %d (+%d), want one at %d", peerName, e.off, e.n, at)
			}
			for c := e.off / cs; c < (e.off+e.n+cs-1)/cs; c++ {
				if zero[c] != e.zero {
					t.Fatalf("%s: chunk %d reported zero=%v, want %v", peerName, c, e.zero, zero[c])
				}
			}
			at += e.n
		}
		if at != n*cs {
			t.Fatalf("%s: extents cover %d bytes, want %d", peerName, at, n*cs)
		}
	}
	type ext = struct {
		off, n int64
		zero   bool
	}
	var nbdinfoMap []struct {
		Offset int64 `json:"offset"`
		Length int64 `json:"length"`
		Type   int   `json:"type"`
	}
	if err := json.Unmarshal([]byte(nbdtest.Peer(t, "nbdinfo", "--map", "--json", uri)), &nbdinfoMap); err != nil {
		t.Fatal(err)
	}
	var exts []ext
	for _, e := range nbdinfoMap {
		if e.Type != 0 && e.Type != 3 {
			t.Fatalf("nbdinfo: extent type %d (want 0 data or 3 hole,zero)", e.Type)
		}
		exts = append(exts, ext{e.Offset, e.Length, e.Type == 3})
	}
	check("nbdinfo --map", exts)
	var qemuMap []struct {
		Start  int64 `json:"start"`
		Length int64 `json:"length"`
		Zero   bool  `json:"zero"`
	}
	if err := json.Unmarshal([]byte(nbdtest.Peer(t, "qemu-img", "map", "--output=json", "-f", "raw", uri)), &qemuMap); err != nil {
		t.Fatal(err)
	}
	exts = exts[:0]
	for _, e := range qemuMap {
		exts = append(exts, ext{e.Start, e.Length, e.Zero})
	}
	check("qemu-img map", exts)
}

// serve serves b as export "test" until the test ends; it returns the
// NBD URI.
func serve(t testing.TB, b nbdsrv.Backend) string {
	t.Helper()
	return nbdtest.Serve(t, nbdsrv.Export{Name: "test", Backend: b}, nbdsrv.Options{}).URI
}
