package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
	"github.com/ctld/ctld/internal/names"
)

// TestBlockPauseResumeSnapshotFork: a block-mode guest appends and syncs
// a counter in a loop. A snapshot while it writes commits a generation
// whose ext4 is clean (e2fsck -fn of the generation read back from the
// store) and whose counter file has no gap; the guest keeps writing. A
// pause seals, publishes head 1 and releases with a clean proof; a
// publish over a stale head is fenced. The resumed generation starts from
// the head: the files are there. A fork of the snapshot is a new identity
// whose claim sees the snapshot's files; the two then diverge.
func TestBlockPauseResumeSnapshotFork(t *testing.T) {
	e := newEnv(t)
	e.startBlock()
	c := e.client()

	req := blockClaimReq("c1", 1, api.Process{Args: []string{"/bin/sh", "-c", blockWriterLoop}})
	fresh, err := c.Claim(ctx(t, 3*time.Minute), "vol", req)
	if err != nil {
		t.Fatalf("block claim: %v", err)
	}
	root := func(id string, gen uint64) string {
		return filepath.Join(e.stateDir, "blockroot", names.Generation(id, gen))
	}
	seqOf := func(id string, gen uint64) func() string {
		return func() string {
			b, _ := os.ReadFile(filepath.Join(root(id, gen), "data", "seq"))
			return string(b)
		}
	}
	guestSh(t, c, "vol", "mkdir -p /data && echo kept > /data/keep && sync") // the loop may not have made /data yet
	waitLines(t, seqOf("vol", 1), 15)

	snap, err := c.Snapshot(ctx(t, 2*time.Minute), "vol", api.SnapshotRequest{Name: "s1"})
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	t.Logf("snapshot s1 = block generation %d: %d chunks (%d bytes) over %s; writes waited %.0f ms (writer barrier %.0f ms), total %.0f ms",
		snap.Snapshot.Generation, snap.Seal.Chunks, snap.Seal.Bytes, snap.Seal.Parent, snap.Seal.FreezeMS, snap.Seal.BarrierMS, snap.Seal.TotalMS)
	atSnap := lines(t, seqOf("vol", 1)())
	waitLines(t, seqOf("vol", 1), atSnap+10) // the guest keeps writing

	repo := e2eRepo(t, e.stateDir)
	img := exportGeneration(t, repo, blockstore.GenRef{Volume: blockstore.Sandbox("vol"), Generation: snap.Snapshot.Generation})
	if out, err := exec.Command("e2fsck", "-fn", img).CombinedOutput(); err != nil {
		t.Fatalf("e2fsck -fn of the snapshot: %v\n%s", err, out)
	}
	seq, err := exec.Command("debugfs", "-R", "cat /data/seq", img).Output()
	if err != nil {
		t.Fatalf("debugfs cat /data/seq of the snapshot: %v", err)
	}
	checkSeq(t, "the snapshot", string(seq), 1)
	if n := lines(t, string(seq)); n > atSnap+5 {
		t.Errorf("the snapshot holds %d lines; the guest had written %d when it returned", n, atSnap)
	}

	p, err := c.Pause(ctx(t, 3*time.Minute), "vol", api.PauseRequest{OperationID: "p1", Generation: 1})
	if err != nil {
		t.Fatalf("pause: %v", err)
	}
	if p.Head.Seq != 1 || !p.Proof.Clean || p.Sandbox.State != api.StateReleased || p.Sandbox.Pause == nil || p.Sandbox.Pause.State != "published" {
		t.Fatalf("pause: head %+v, proof clean %v, sandbox %s %+v", p.Head, p.Proof.Clean, p.Sandbox.State, p.Sandbox.Pause)
	}
	t.Logf("pause: head %d = block generation %d over %s, %d chunks; frozen %.0f ms, total %.0f ms",
		p.Head.Seq, p.Head.Generation, p.Seal.Parent, p.Seal.Chunks, p.Seal.FreezeMS, p.Seal.TotalMS)
	// A writer that started from no head (a stale one) cannot publish.
	_, err = repo.Publish(context.Background(), blockstore.Sandbox("vol"), blockstore.Head{}, blockstore.Head{Generation: snap.Snapshot.Generation, WriterEpoch: p.Head.WriterEpoch + 1})
	if !errors.Is(err, blockstore.ErrFenced) {
		t.Errorf("publish over a stale head: %v, want fenced", err)
	}

	req2 := req
	req2.OperationID, req2.Generation = "c2", 2
	req2.Process = api.Process{Args: []string{"/bin/sleep", "1000000"}} // the files as paused, untouched
	resumed, err := c.Claim(ctx(t, 3*time.Minute), "vol", req2)
	if err != nil {
		t.Fatalf("resume (claim of generation 2): %v", err)
	}
	if resumed.Sandbox.Writer == nil || resumed.Sandbox.Writer.Base != "sandboxes/vol@"+strconv.FormatUint(p.Head.Generation, 10) {
		t.Errorf("the resumed generation's writer %+v: want its base to be the head, generation %d", resumed.Sandbox.Writer, p.Head.Generation)
	}
	logTimings(t, "fresh claim", fresh.Sandbox.Timings)
	logTimings(t, "resume", resumed.Sandbox.Timings)
	t.Logf("resume-to-ready vs a fresh claim from the template: %.0f / %.0f ms = %.2fx",
		resumed.Sandbox.Timings.TotalMS, fresh.Sandbox.Timings.TotalMS, resumed.Sandbox.Timings.TotalMS/fresh.Sandbox.Timings.TotalMS)
	if got := guestSh(t, c, "vol", "cat /data/keep"); got != "kept\n" {
		t.Errorf("/data/keep after the resume: %q", got)
	}
	checkSeq(t, "after the resume", guestSh(t, c, "vol", "cat /data/seq"), atSnap)

	if _, err := c.Fork(ctx(t, time.Minute), "fork", api.ForkRequest{Source: "vol", Snapshot: "s1"}); err != nil {
		t.Fatalf("fork: %v", err)
	}
	freq := claimReq("f1", 1)
	freq.RootFS.Mode = api.RootFSBlock
	if _, err := c.Claim(ctx(t, 3*time.Minute), "fork", freq); err != nil {
		t.Fatalf("claim of the fork: %v", err)
	}
	if got := guestSh(t, c, "fork", "cat /data/keep"); got != "kept\n" {
		t.Errorf("/data/keep in the fork: %q", got)
	}
	guestSh(t, c, "fork", "echo fork > /data/who && sync")
	guestSh(t, c, "vol", "echo vol > /data/who && sync")
	if a, b := guestSh(t, c, "vol", "cat /data/who"), guestSh(t, c, "fork", "cat /data/who"); a != "vol\n" || b != "fork\n" {
		t.Errorf("after diverging: vol reads %q, fork reads %q", a, b)
	}
	for _, r := range []struct {
		id, op string
		gen    uint64
	}{{"vol", "r2", 2}, {"fork", "rf", 1}} {
		rel, err := c.Release(ctx(t, 3*time.Minute), r.id, api.ReleaseRequest{OperationID: r.op, Generation: r.gen})
		if err != nil || !rel.Proof.Clean {
			t.Fatalf("release %s: %v (proof %+v)", r.id, err, rel.Proof.Checks)
		}
	}
}

// e2eRepo opens the node's directory block store with its node key.
func e2eRepo(t *testing.T, stateDir string) *blockstore.Repo {
	t.Helper()
	nk, err := blockstore.LoadNodeKeyFile(filepath.Join(stateDir, "blockstore.key"), "node")
	if err != nil {
		t.Fatal(err)
	}
	st, err := dirstore.Open(filepath.Join(stateDir, "blockstore"))
	if err != nil {
		t.Fatal(err)
	}
	repo, err := blockstore.New(st, nk, blockstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return repo
}

// exportGeneration writes a committed generation's device to a sparse
// file (holes for zero chunks) and returns its path.
func exportGeneration(t *testing.T, repo *blockstore.Repo, ref blockstore.GenRef) string {
	t.Helper()
	cx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	img, err := repo.Open(cx, ref)
	if err != nil {
		t.Fatalf("open %s: %v", ref, err)
	}
	path := filepath.Join(t.TempDir(), "gen.img")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(img.DeviceSize())); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, img.ChunkSize())
	for i := uint64(0); i < img.Chunks(); i++ {
		if img.IsZero(i) {
			continue
		}
		if err := img.ReadChunk(cx, i, buf); err != nil {
			t.Fatalf("read chunk %d of %s: %v", i, ref, err)
		}
		if _, err := f.WriteAt(buf, int64(i)*int64(len(buf))); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}
