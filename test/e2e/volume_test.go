package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/template"
	"github.com/ctld/ctld/internal/writer"
)

// TestPersistentVolumeMoves: a persistent volume created in the node's
// block store is attached to sandbox A at /data; a file A writes there is
// sealed and published as the volume's head when A is released (clean
// proof), also after a kill -9 of the volume's writer (ctld's watch
// restarts it on the same device, the guest's next write and sync see no
// error); a claim naming the volume while A holds it is refused; a later
// sandbox B attaches the same volume at another path and reads the file.
// No leak (mounts, NBD devices, writers) is left.
func TestPersistentVolumeMoves(t *testing.T) {
	e := newEnv(t)
	e.startBlock()
	c := e.client()

	repo := e2eRepo(t, e.stateDir)
	if _, err := template.CreateVolume(context.Background(), repo, "data", 16<<20, t.TempDir()); err != nil {
		t.Fatalf("create volume: %v", err)
	}

	a := claimReq("a1", 1)
	a.Process = api.Process{Args: []string{"/bin/sleep", "1000000"}}
	a.Volumes = []api.VolumeMount{{ID: "data", Path: "/data"}}
	resp, err := c.Claim(ctx(t, 3*time.Minute), "va", a)
	if err != nil {
		t.Fatalf("claim A with the volume: %v", err)
	}
	if len(resp.Sandbox.Volumes) != 1 || resp.Sandbox.Volumes[0].ID != "data" {
		t.Errorf("A's volumes %+v, want data", resp.Sandbox.Volumes)
	}
	guestSh(t, c, "va", "echo moved > /data/f && sync")

	// kill -9 of the volume's writer: ctld's watch starts the next one on
	// the same device; the guest's next write and sync see no error.
	stateFile := filepath.Join(e.stateDir, "writers", "vol", names.Generation("va", 1), "data", writer.StateName)
	before := readWriterState(t, stateFile)
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 volume writer %d: %v", before.PID, err)
	}
	killed := time.Now()
	guestSh(t, c, "va", "echo after-kill >> /data/f && sync")
	var after writer.State
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if b, err := os.ReadFile(stateFile); err == nil && strings.Contains(string(b), `"epoch"`) {
			if after = readWriterState(t, stateFile); after.PID != before.PID && after.Epoch > before.Epoch {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new volume writer a minute after the kill -9; state %+v", after)
		}
	}
	if after.Index != before.Index {
		t.Fatalf("restarted volume writer on %s, want the same device %s", after.Device, before.Device)
	}
	t.Logf("volume writer pid %d epoch %d killed; pid %d epoch %d serves %s; the guest's write and sync returned %v after the kill",
		before.PID, before.Epoch, after.PID, after.Epoch, after.Device, time.Since(killed).Round(time.Millisecond))

	b := claimReq("b1", 1)
	b.Process = a.Process
	b.Volumes = []api.VolumeMount{{ID: "data", Path: "/mnt/v"}}
	if _, err := c.Claim(ctx(t, time.Minute), "vb", b); codeOf(err) != "conflict" || !strings.Contains(err.Error(), "attached to sandbox va") {
		t.Fatalf("claim B while A holds the volume: %v, want conflict", err)
	}

	rel, err := c.Release(ctx(t, 3*time.Minute), "va", api.ReleaseRequest{OperationID: "ra", Generation: 1})
	if err != nil || !rel.Proof.Clean {
		t.Fatalf("release A: %v (proof %+v)", err, rel.Proof.Checks)
	}
	for _, ch := range rel.Proof.Checks {
		if ch.Name == "volumes_detached" {
			t.Logf("volumes_detached: %s", ch.Detail)
			if !strings.Contains(ch.Detail, "published head 2") {
				t.Errorf("A's proof does not report the volume's publish: %s", ch.Detail)
			}
		}
	}
	h, err := repo.Head(context.Background(), blockstore.Vol("data"))
	if err != nil || h.Seq != 2 {
		t.Fatalf("the volume's head after A: %+v, %v; want head 2", h, err)
	}

	b.OperationID = "b2"
	if _, err := c.Claim(ctx(t, 3*time.Minute), "vb", b); err != nil {
		t.Fatalf("claim B with the volume after A: %v", err)
	}
	if got := guestSh(t, c, "vb", "cat /mnt/v/f"); got != "moved\nafter-kill\n" {
		t.Errorf("B reads %q from the volume, want A's file", got)
	}
	rel, err = c.Release(ctx(t, 3*time.Minute), "vb", api.ReleaseRequest{OperationID: "rb", Generation: 1})
	if err != nil || !rel.Proof.Clean {
		t.Fatalf("release B: %v (proof %+v)", err, rel.Proof.Checks)
	}
	if h, err := repo.Head(context.Background(), blockstore.Vol("data")); err != nil || h.Seq != 3 {
		t.Errorf("the volume's head after B: %+v, %v; want head 3", h, err)
	}
}
