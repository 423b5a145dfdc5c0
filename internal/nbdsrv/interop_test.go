package nbdsrv_test

// Interop with NBD peers none of us wrote (libnbd's nbdinfo/nbdcopy, QEMU's
// qemu-img/qemu-io), over a Unix socket on the host.

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/nbdsrv/nbdtest"
)

func TestNbdinfoReportsSizeAndFlags(t *testing.T) {
	nbdtest.NeedPeers(t, "nbdinfo")
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	const size = 3<<20 + 512
	sparseFile(t, img, size)

	type export struct {
		Size       int64  `json:"export-size"`
		ReadOnly   bool   `json:"is_read_only"`
		CanFlush   bool   `json:"can_flush"`
		CanFUA     bool   `json:"can_fua"`
		CanTrim    bool   `json:"can_trim"`
		CanZero    bool   `json:"can_zero"`
		CanMulti   bool   `json:"can_multi_conn"`
		ExportName string `json:"export-name"`
	}
	info := func(uri string) export {
		t.Helper()
		var v struct {
			Protocol string   `json:"protocol"`
			Exports  []export `json:"exports"`
		}
		out := nbdtest.Peer(t, "nbdinfo", "--json", uri)
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("nbdinfo output: %v\n%s", err, out)
		}
		if v.Protocol != "newstyle-fixed" || len(v.Exports) != 1 {
			t.Fatalf("nbdinfo: protocol %q, %d exports\n%s", v.Protocol, len(v.Exports), out)
		}
		return v.Exports[0]
	}

	rw := info(serveFile(t, img, false).URI)
	want := export{ExportName: "test", Size: size, CanFlush: true, CanFUA: true, CanTrim: true, CanZero: true, CanMulti: true}
	if rw != want {
		t.Errorf("read-write export: nbdinfo says %+v, want %+v", rw, want)
	}
	ro := info(serveFile(t, img, true).URI)
	want = export{ExportName: "test", Size: size, ReadOnly: true, CanFlush: true, CanMulti: true}
	if ro != want {
		t.Errorf("read-only export: nbdinfo says %+v, want %+v", ro, want)
	}
}

// nbdcopy runs many requests in flight over several connections: the image
// comes out byte-identical both ways only if concurrent replies are framed
// and matched right.
func TestNbdcopyInAndOutIsByteIdentical(t *testing.T) {
	nbdtest.NeedPeers(t, "nbdcopy")
	dir := t.TempDir()
	ref := filepath.Join(dir, "ref.img")
	const size = 48<<20 + 4096
	want := refImage(t, ref, size)
	disk := filepath.Join(dir, "disk.img")
	sparseFile(t, disk, size)
	s := serveFile(t, disk, false)

	nbdtest.Peer(t, "nbdcopy", "--flush", ref, s.URI)
	sameFile(t, disk, want)
	out := filepath.Join(dir, "out.img")
	nbdtest.Peer(t, "nbdcopy", s.URI, out)
	sameFile(t, out, want)
	// Again with one connection and small requests: many more requests.
	out2 := filepath.Join(dir, "out2.img")
	nbdtest.Peer(t, "nbdcopy", "--connections=1", "--request-size=4096", "--requests=64", s.URI, out2)
	sameFile(t, out2, want)
}

func TestQemuImgConvertAndCompare(t *testing.T) {
	nbdtest.NeedPeers(t, "qemu-img")
	dir := t.TempDir()
	ref := filepath.Join(dir, "ref.img")
	const size = 32 << 20
	want := refImage(t, ref, size)
	disk := filepath.Join(dir, "disk.img")
	sparseFile(t, disk, size)
	s := serveFile(t, disk, false)

	nbdtest.Peer(t, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", ref, s.URI)
	sameFile(t, disk, want)
	if out := nbdtest.Peer(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", ref, s.URI); !strings.Contains(out, "Images are identical") {
		t.Fatalf("qemu-img compare: %s", out)
	}
	out := filepath.Join(dir, "out.qcow2")
	nbdtest.Peer(t, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", s.URI, out)
	nbdtest.Peer(t, "qemu-img", "compare", "-f", "raw", "-F", "qcow2", ref, out)

	// compare is not vacuous: one changed byte behind the server is seen.
	f, err := os.OpenFile(disk, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{want[size/2] ^ 0xff}, size/2); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if out, err := nbdtest.PeerErr("qemu-img", "compare", "-f", "raw", "-F", "raw", ref, s.URI); err == nil {
		t.Fatalf("qemu-img compare found no difference after a byte changed: %s", out)
	}
}

// qemu-io sends WRITE (with and without FUA), FLUSH, TRIM and WRITE_ZEROES
// (with NO_HOLE, and unmapping) and checks what reads back; the file behind
// the server shows the trimmed range punched out.
func TestQemuIOFlushTrimWriteZeroes(t *testing.T) {
	nbdtest.NeedPeers(t, "qemu-io")
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.img")
	const size = 16 << 20
	if err := os.WriteFile(disk, bytes.Repeat([]byte{0xab}, size), 0o600); err != nil {
		t.Fatal(err)
	}
	s := serveFile(t, disk, false)
	cmds := []string{
		"write -P 0xcd 0 1M",
		"write -f -P 0xce 1M 64k", // FUA
		"flush",
		"read -P 0xcd 0 1M",
		"read -P 0xce 1M 64k",
		"discard 2M 1M",
		"read -P 0 2M 1M",
		"write -z 4M 1M", // NO_HOLE
		"read -P 0 4M 1M",
		"write -z -u 6M 1M", // may unmap
		"read -P 0 6M 1M",
		"read -P 0xab 8M 1M",
		"discard 10M 4k",
		"read -P 0 10M 4k",
		"read -P 0xab 10485248 512",
		"read -P 0xab 10489856 512",
		"flush",
	}
	args := []string{"-f", "raw", "-d", "unmap"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out := nbdtest.Peer(t, "qemu-io", append(args, s.URI)...)
	if strings.Contains(out, "failed") || strings.Contains(out, "error") {
		t.Fatalf("qemu-io reported a failure:\n%s", out)
	}
	if n := strings.Count(out, "read "); n != 9 {
		t.Fatalf("qemu-io: %d reads reported, want 9:\n%s", n, out)
	}

	// Behind the server: the data, and TRIM punched a hole.
	got, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	check := func(off, n int, b byte) {
		t.Helper()
		if !bytes.Equal(got[off:off+n], bytes.Repeat([]byte{b}, n)) {
			t.Errorf("file [%d,+%d) is not all %#x", off, n, b)
		}
	}
	check(0, 1<<20, 0xcd)
	check(1<<20, 64<<10, 0xce)
	check(2<<20, 1<<20, 0)
	check(4<<20, 1<<20, 0)
	check(6<<20, 1<<20, 0)
	check(8<<20, 1<<20, 0xab)
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hole, err := unix.Seek(int(f.Fd()), 2<<20, unix.SEEK_HOLE)
	if err != nil {
		t.Fatal(err)
	}
	if hole != 2<<20 {
		t.Errorf("trimmed range: first hole at/after 2 MiB is at %d, want 2 MiB (TRIM did not punch)", hole)
	}
}
