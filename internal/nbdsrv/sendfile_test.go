package nbdsrv_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ctld/ctld/internal/nbdsrv"
	"github.com/ctld/ctld/internal/nbdsrv/nbdtest"
)

// fileReader is a File backend that also offers its reads as file
// segments, split at every 4 KiB boundary the way a striped cache would,
// except in the ranges it refuses (read with ReadAt instead).
type fileReader struct {
	*nbdsrv.File
	fd      int
	refuse  func(off int64) bool
	served  atomic.Int64 // reads answered with segments
	refused atomic.Int64
}

func (f *fileReader) ReadFiles(segs []nbdsrv.FileSegment, off int64, n int) ([]nbdsrv.FileSegment, bool) {
	if f.refuse(off) {
		f.refused.Add(1)
		return segs, false
	}
	for at := off; at < off+int64(n); {
		l := min(4096-at%4096, off+int64(n)-at)
		segs = append(segs, nbdsrv.FileSegment{Fd: f.fd, Off: at, Len: int(l)})
		at += l
	}
	f.served.Add(1)
	return segs, true
}

// Reads a FileReader offers as file segments are sent with sendfile and
// read back byte-identical by peers none of us wrote (nbdcopy with
// structured replies, qemu-img compare), mixed with reads it refuses,
// which go through ReadAt; unaligned reads (qemu-io) too.
func TestFileReaderReplies(t *testing.T) {
	nbdtest.NeedPeers(t, "nbdcopy", "qemu-img", "qemu-io")
	dir := t.TempDir()
	img := filepath.Join(dir, "img")
	want := refImage(t, img, 8<<20)
	f, err := nbdsrv.OpenFile(img, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	raw, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	fr := &fileReader{File: f, fd: int(raw.Fd()), refuse: func(off int64) bool { return off/(256<<10)%3 == 1 }}
	s := nbdtest.Serve(t, nbdsrv.Export{Name: "test", Backend: fr, ReadOnly: true}, nbdsrv.Options{})

	out := filepath.Join(dir, "copy")
	nbdtest.Peer(t, "nbdcopy", s.URI, out)
	sameFile(t, out, want)
	nbdtest.Peer(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", img, s.URI)
	o := nbdtest.Peer(t, "qemu-io", "-r", "-f", "raw", "-c", "read -v 4095 3", s.URI)
	if hex := fmt.Sprintf("%02x %02x %02x", want[4095], want[4096], want[4097]); !strings.Contains(o, hex) {
		t.Fatalf("qemu-io read of bytes 4095..4097: %q, want %s", o, hex)
	}
	// Simple replies (the kernel's client asks for no structured ones):
	// a read sent from files and one refused, each byte-identical.
	r := connect(t, s.Sock)
	for h, off := range []uint64{0, 256 << 10, 3<<20 + 77} {
		served := fr.served.Load()
		if got := r.read(uint64(h+1), off, 200<<10); !bytes.Equal(got, want[off:off+200<<10]) {
			t.Fatalf("simple reply to a read at %d (from files: %v) differs", off, fr.served.Load() > served)
		}
	}
	if got, w := fr.served.Load(), fr.refused.Load(); got == 0 || w == 0 {
		t.Fatalf("%d reads sent from files, %d refused: want both paths taken", got, w)
	}
	t.Logf("%d reads sent from files, %d through ReadAt; qemu-io: %.60q", fr.served.Load(), fr.refused.Load(), o)
}
