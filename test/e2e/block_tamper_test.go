package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
	"github.com/ctld/ctld/internal/ha"
	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/template"
	"github.com/ctld/ctld/internal/writer"
)

// tamperBlob is the template file whose chunk the test tampers with.
const tamperBlob = "/tamper/blob"

// TestBlockTamperedObjectIsReadErrorInGuest: one flipped byte in one
// object of the block store is a read error in the guest, never other
// data. A template ("tamper": the busybox tree plus a file of random
// bytes) is imported with `ctl-manager template import` into the node's
// block store; a block-mode guest reads the file intact. Then one byte of
// the object of one chunk that holds only that file's bytes is flipped.
// A fresh claim (a new writer, so no chunk cache; a new mount, so no page
// cache; the node's base cache of the template emptied) reads the file: the read fails with an I/O error, and what it
// returned before failing is the file's own prefix, none of the tampered
// chunk; the bytes before and after that chunk still read right, and the
// guest still writes and syncs. ctld stays healthy, the generation ready,
// and release ends with a clean proof (nbd_quiescent) and no leak.
//
// Dirty data never reaches the store yet (sealing is part 2 of the
// durable RootFS), so the tampered object is one of the template's
// generation 0.
func TestBlockTamperedObjectIsReadErrorInGuest(t *testing.T) {
	e := newEnv(t)
	e.useBlock()
	e.start("a")
	e.waitPrimary("a", 2*time.Minute)
	c := e.client()

	// The template: busybox (the readiness probe and the tools) and 512
	// KiB of random bytes, whose chunks hold nothing else.
	src := filepath.Join(t.TempDir(), "tree")
	if err := template.BuildBusybox(src, "/bin/busybox"); err != nil {
		t.Fatal(err)
	}
	blob := make([]byte, 512<<10)
	_, _ = rand.Read(blob)
	if err := os.MkdirAll(filepath.Join(src, filepath.Dir(tamperBlob)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, tamperBlob), blob, 0o644); err != nil {
		t.Fatal(err)
	}
	storeDir, keyFile := filepath.Join(e.stateDir, "blockstore"), filepath.Join(e.stateDir, "blockstore.key")
	out := e.ctlManager("template", "import", "tamper", src, "--size", "64Mi", "--store", storeDir, "--node-key", keyFile)
	t.Logf("ctl-manager template import: %s", strings.TrimSpace(out))

	req := claimReq("c1", 1)
	req.RootFS = api.RootFS{Mode: api.RootFSBlock, Template: "tamper"}
	guest := func(id, script string) api.ExecResult {
		t.Helper()
		r, err := c.Exec(ctx(t, 2*time.Minute), id, api.ExecRequest{Args: []string{"/bin/sh", "-c", script}})
		if err != nil {
			t.Fatalf("exec %q in %s: %v", script, id, err)
		}
		return r
	}
	release := func(id, op string) api.ReleaseResponse {
		t.Helper()
		rel, err := c.Release(ctx(t, 3*time.Minute), id, api.ReleaseRequest{OperationID: op, Generation: 1})
		if err != nil {
			t.Fatalf("release %s: %v", id, err)
		}
		if !rel.Proof.Clean {
			t.Fatalf("release %s: proof not clean: %+v", id, rel.Proof.Checks)
		}
		return rel
	}

	// Before the flip: the guest reads the file as imported.
	if _, err := c.Claim(ctx(t, 3*time.Minute), "intact", req); err != nil {
		t.Fatalf("block claim of the template: %v", err)
	}
	want := sha256.Sum256(blob)
	if r := guest("intact", "sha256sum "+tamperBlob); r.ExitCode != 0 || !strings.HasPrefix(string(r.Stdout), hex.EncodeToString(want[:])) {
		t.Fatalf("the intact file in the guest: exit %d, %q %q; want sha256 %x", r.ExitCode, r.Stdout, r.Stderr, want)
	}
	release("intact", "r-intact")
	// The first claim left the chunks it read, verified, in the node's
	// base cache, where the next writer would read them instead of the
	// store (so the tampered object would never be read). Emptied: the
	// next claim reads as on a node that has not read this template.
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	cached := filepath.Join(e.stateDir, "basecache", strings.TrimSpace(string(boot)), string(blockstore.KindTemplate), "tamper")
	if _, err := os.Stat(cached); err != nil {
		t.Fatalf("the first claim's base cache: %v", err)
	}
	if err := os.RemoveAll(cached); err != nil {
		t.Fatal(err)
	}

	off, obj, pos := blobChunkObject(t, storeDir, keyFile, "tamper", blob)
	b, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	b[pos] ^= 0x01
	if err := os.WriteFile(obj, b, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("flipped byte %d of %s (%d bytes): the chunk of %s bytes [%d, %d)", pos, obj, len(b), tamperBlob, off, off+blockstore.DefaultChunkSize)

	// A fresh claim of the same template reads it from the device.
	req.OperationID = "c2"
	if _, err := c.Claim(ctx(t, 3*time.Minute), "tampered", req); err != nil {
		t.Fatalf("block claim of the tampered template: %v", err)
	}
	readErrs := `ctld_nbd_errors_total{kind="read"}`
	before := e.metrics(t, "a")[readErrs]
	r := guest("tampered", "cat "+tamperBlob)
	t.Logf("cat in the guest: exit %d, %d bytes out, stderr %q", r.ExitCode, len(r.Stdout), r.Stderr)
	if r.ExitCode == 0 || !strings.Contains(string(r.Stderr), "Input/output error") {
		t.Errorf("reading the tampered file: exit %d, stderr %q; want a failed read with an I/O error", r.ExitCode, r.Stderr)
	}
	if !bytes.HasPrefix(blob, r.Stdout) {
		t.Errorf("the guest read %d bytes that are not the file's prefix: wrong data", len(r.Stdout))
	} else if len(r.Stdout) > off {
		t.Errorf("the guest read %d bytes, past the tampered chunk at %d", len(r.Stdout), off)
	}
	// Only that chunk fails: the bytes before and after it read right.
	const bs = 4096
	head := guest("tampered", fmt.Sprintf("dd if=%s bs=%d count=%d 2>/dev/null", tamperBlob, bs, off/bs))
	tail := guest("tampered", fmt.Sprintf("dd if=%s bs=%d skip=%d 2>/dev/null", tamperBlob, bs, (off+blockstore.DefaultChunkSize)/bs))
	if head.ExitCode != 0 || !bytes.Equal(head.Stdout, blob[:off]) {
		t.Errorf("the %d bytes before the tampered chunk: exit %d, %d bytes, equal %v", off, head.ExitCode, len(head.Stdout), bytes.Equal(head.Stdout, blob[:off]))
	}
	if rest := blob[off+blockstore.DefaultChunkSize:]; tail.ExitCode != 0 || !bytes.Equal(tail.Stdout, rest) {
		t.Errorf("the %d bytes after the tampered chunk: exit %d, %d bytes, equal %v", len(rest), tail.ExitCode, len(tail.Stdout), bytes.Equal(tail.Stdout, rest))
	}
	// A second read fails the same way (no cache kept other bytes).
	if again := guest("tampered", "cat "+tamperBlob+" >/dev/null"); again.ExitCode == 0 {
		t.Errorf("a second read of the tampered file succeeded: %q", again.Stderr)
	}
	// The device still writes and syncs.
	if w := guest("tampered", "echo known > /written && sync && cat /written"); w.ExitCode != 0 || string(w.Stdout) != "known\n" {
		t.Errorf("write and sync after the read error: exit %d, %q %q", w.ExitCode, w.Stdout, w.Stderr)
	}

	// ctld is healthy and the generation ready.
	st, err := ha.Probe(ctx(t, 10*time.Second), filepath.Join(e.runDir, "ctld-a.sock"))
	if err != nil || st.Role != ha.RolePrimary || st.Health != "ok" {
		t.Errorf("ctld after the guest's read error: %+v, %v; want a healthy primary", st, err)
	}
	if s, err := c.Get(ctx(t, time.Minute), "tampered"); err != nil || s.State != api.StateReady {
		t.Errorf("the generation after the read error: %+v, %v; want ready", s.State, err)
	} else if s.Usage == nil || s.Usage.DiskUsedBytes < blockstore.DefaultChunkSize {
		// The guest wrote and synced a file: at least one chunk of the
		// writer's dirty file (usage of a block root).
		t.Errorf("block generation's usage %+v: want disk used of at least one chunk", s.Usage)
	} else {
		t.Logf("block generation's disk used: %d bytes", s.Usage.DiskUsedBytes)
	}
	// The writer says why: the object failed authentication.
	wl, _ := os.ReadFile(filepath.Join(e.stateDir, "writers", names.Generation("tampered", 1), writer.LogName))
	// A packed chunk's error names its chunk key and the pack it is in.
	named := "corrupt object: " + strings.TrimPrefix(obj, storeDir+"/")
	if rel := strings.TrimPrefix(obj, storeDir+"/"); strings.Contains(rel, "/packs/") {
		named = "authentication failed (in pack " + rel + " at "
	}
	if n := strings.Count(string(wl), named); n == 0 {
		t.Errorf("the writer's log names no corrupt object %s:\n%s", obj, wl)
	} else {
		t.Logf("the writer refused the tampered object %d times (authentication failed)", n)
	}

	// And the metrics count it: the writer's failed reads, read from it
	// over its control socket at the scrape (ctld_nbd_errors_total).
	m := e.metrics(t, "a")
	if got := m[readErrs]; got < before+1 || m[`ctld_writers_unread`] != 0 {
		t.Errorf("%s = %v after the failed reads (%v before), ctld_writers_unread %v; want it grown, all writers read", readErrs, got, before, m[`ctld_writers_unread`])
	} else {
		var kinds []string
		for k, v := range m {
			if strings.HasPrefix(k, "ctld_nbd_errors_total") {
				kinds = append(kinds, fmt.Sprintf("%s %v", k, v))
			}
		}
		t.Logf("%s: %v before the reads, %v after; all: %s", readErrs, before, got, strings.Join(kinds, ", "))
	}

	rel := release("tampered", "r-tampered")
	var quiet bool
	for _, ch := range rel.Proof.Checks {
		if ch.Name == "nbd_quiescent" {
			quiet = ch.OK
			t.Logf("nbd_quiescent: %s", ch.Detail)
		}
	}
	if !quiet {
		t.Errorf("proof has no passing nbd_quiescent check: %+v", rel.Proof.Checks)
	}
}

// blobChunkObject finds, in template name's generation 0, a chunk whose
// 64 KiB are all blob's (a 4 KiB-aligned stretch of it, with bytes of
// blob after it) and returns its offset in blob, the file holding its
// sealed object and the offset there of a byte of that object.
func blobChunkObject(t *testing.T, storeDir, keyFile, name string, blob []byte) (int, string, int64) {
	t.Helper()
	kb, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := hex.DecodeString(strings.TrimSpace(string(kb)))
	if err != nil {
		t.Fatal(err)
	}
	nk, err := blockstore.NewNodeKey("node", raw)
	if err != nil {
		t.Fatal(err)
	}
	st, err := dirstore.Open(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	repo, err := blockstore.New(st, nk, blockstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	vol := blockstore.Template(name)
	img, err := repo.Open(cx, blockstore.GenRef{Volume: vol})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, img.ChunkSize())
	for _, en := range img.Manifest().Entries {
		if en.Kind != blockstore.EntryData {
			continue
		}
		if err := img.ReadChunk(cx, en.Index, buf); err != nil {
			t.Fatal(err)
		}
		off := bytes.Index(blob, buf)
		if off < 0 || off%4096 != 0 || off+2*len(buf) > len(blob) {
			continue
		}
		// Loose or in a pack (a template import packs its chunks): the
		// byte in the middle of the chunk's sealed object.
		key, at, n, ok := img.ChunkObject(en.Index)
		if !ok {
			t.Fatalf("chunk %d has no object", en.Index)
		}
		obj := filepath.Join(storeDir, filepath.FromSlash(key))
		fi, err := os.Stat(obj)
		if err != nil {
			t.Fatalf("the object of chunk %d: %v", en.Index, err)
		}
		if n < 0 {
			n = fi.Size()
		}
		return off, obj, at + n/2
	}
	t.Fatalf("no chunk of template %s holds only %s's bytes", name, tamperBlob)
	return 0, "", 0
}
