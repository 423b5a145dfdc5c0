package e2e

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/diskquota"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/proof"
)

// diskSlack is how far below its lease a guest's file may stop: the
// lease also pays for the upper's directories and the filesystem's
// allocation granularity.
const diskSlack = 2 << 20

// TestDiskLeaseStopsGuestAtENOSPC: a real guest with a 32 MiB disk lease
// writes with dd until the kernel refuses; the file stops at the lease
// (within diskSlack), the host's scratch filesystem keeps its free space,
// and the node still claims (with its default lease), releases both and
// proves them clean, the disk quota cleared.
func TestDiskLeaseStopsGuestAtENOSPC(t *testing.T) {
	e := newEnv(t)
	e.start("a")
	n0 := e.waitPrimary("a", 60*time.Second)
	c := e.client()
	cx := ctx(t, 5*time.Minute)

	var sfs unix.Statfs_t
	if err := unix.Statfs(e.stateDir, &sfs); err != nil {
		t.Fatal(err)
	}
	if size := int64(sfs.Blocks) * sfs.Bsize; n0.Capacity.Total.DiskBytes != size || n0.Capacity.Allocatable.DiskBytes != size-1<<30 {
		t.Fatalf("disk capacity total %d allocatable %d; want the scratch filesystem's size %d and that minus the 1 GiB reserve",
			n0.Capacity.Total.DiskBytes, n0.Capacity.Allocatable.DiskBytes, size)
	}

	const lease = 32 << 20
	req := claimReq("claim-fill-1", 1)
	req.Resources.DiskBytes = lease
	res, err := c.Claim(cx, "fill", req)
	if err != nil {
		t.Fatalf("claim with a disk lease: %v", err)
	}
	if n, _ := c.Node(cx); n.Capacity.Leased.DiskBytes != lease {
		t.Fatalf("leased disk %d, want %d", n.Capacity.Leased.DiskBytes, lease)
	}
	freeBefore := freeBytes(t, e.stateDir)

	r, err := c.Exec(cx, "fill", api.ExecRequest{Args: []string{"/bin/sh", "-c", "dd if=/dev/zero of=/root/fill bs=65536; echo dd=$? >&2; sync"}})
	if err != nil {
		t.Fatalf("exec dd: %v", err)
	}
	t.Logf("guest dd: %s", strings.TrimSpace(string(r.Stderr)))
	if !strings.Contains(string(r.Stderr), "dd=1") || !strings.Contains(string(r.Stderr), "No space left on device") {
		t.Fatalf("guest dd did not stop with ENOSPC: stderr %q", r.Stderr)
	}
	r, err = c.Exec(cx, "fill", api.ExecRequest{Args: []string{"/bin/stat", "-c", "%s", "/root/fill"}})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("stat the guest's file: %+v, %v", r, err)
	}
	size, err := strconv.ParseInt(strings.TrimSpace(string(r.Stdout)), 10, 64)
	if err != nil || size > lease || size < lease-diskSlack {
		t.Fatalf("guest wrote %d bytes (%v) under a %d-byte lease; want within %d below it", size, err, lease, diskSlack)
	}
	// The host's view: the generation's project is at its limit, and the
	// filesystem lost about the lease, not everything.
	qs, err := diskquota.List(e.stateDir, 1, ^uint32(0))
	if err != nil || len(qs) != 1 || qs[0].LimitBytes != lease || qs[0].UsedBytes > lease || qs[0].UsedBytes < lease-diskSlack {
		t.Fatalf("host project quotas %+v, %v; want one at its %d-byte limit", qs, err, lease)
	}
	freeAfter := freeBytes(t, e.stateDir)
	t.Logf("guest file %d bytes, project uses %d of %d; host free %d -> %d", size, qs[0].UsedBytes, lease, freeBefore, freeAfter)
	if freeBefore-freeAfter > lease+diskSlack || freeAfter < 1<<30 {
		t.Fatalf("host free space went %d -> %d: more than the lease", freeBefore, freeAfter)
	}

	// The node still claims (default lease), and the second guest can write.
	res2, err := c.Claim(cx, "second", claimReq("claim-second-1", 1))
	if err != nil {
		t.Fatalf("claim after a guest filled its lease: %v", err)
	}
	if res2.Sandbox.Resources.DiskBytes != e.defaultDisk() {
		t.Fatalf("claim without disk_bytes got %d, want the node default %d", res2.Sandbox.Resources.DiskBytes, e.defaultDisk())
	}
	r, err = c.Exec(cx, "second", api.ExecRequest{Args: []string{"/bin/sh", "-c", "echo hi > /root/x && cat /root/x"}})
	if err != nil || r.ExitCode != 0 || string(r.Stdout) != "hi\n" {
		t.Fatalf("second guest write: %+v, %v", r, err)
	}
	// A lease larger than what is free is refused, naming disk.
	n1, _ := c.Node(cx)
	big := claimReq("claim-big-1", 1)
	big.Resources.DiskBytes = n1.Capacity.Allocatable.DiskBytes - n1.Capacity.Leased.DiskBytes + 1
	if _, err := c.Claim(cx, "big", big); errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted || !strings.Contains(err.Error(), "disk") {
		t.Fatalf("claim of more disk than free: %v, want capacity_exhausted naming disk", err)
	}

	for _, sb := range []api.Sandbox{res.Sandbox, res2.Sandbox} {
		rel, err := c.Release(cx, sb.ID, api.ReleaseRequest{OperationID: "release-" + sb.ContainerID, Generation: sb.Generation})
		if err != nil {
			t.Fatalf("release %s: %v", sb.ID, err)
		}
		if !rel.Proof.Clean {
			t.Fatalf("proof of %s not clean: %+v", sb.ID, rel.Proof.Checks)
		}
		if err := proof.Verify(rel.Proof.Record(), n0.NodeKey); err != nil {
			t.Fatalf("verify proof of %s: %v", sb.ID, err)
		}
		if !hasCheck(rel.Proof, "disk_quota_cleared") {
			t.Fatalf("proof of %s has no passing disk_quota_cleared check: %+v", sb.ID, rel.Proof.Checks)
		}
	}
	if n, _ := c.Node(cx); n.Capacity.Leased != (api.Capacity{}) {
		t.Fatalf("capacity not returned: leased %+v", n.Capacity.Leased)
	}
	if qs, err := diskquota.List(e.stateDir, 1, ^uint32(0)); err != nil || len(qs) != 0 {
		t.Fatalf("project quotas left after release: %+v, %v", qs, err)
	}
}

// TestDiskLeaseRefusedWhereUnenforceable: with its scratch dir on tmpfs,
// which cannot enforce a disk lease, the node refuses every claim with a
// clear error and journals nothing; `ctld doctor` says what to fix.
func TestDiskLeaseRefusedWhereUnenforceable(t *testing.T) {
	e := newEnv(t)
	e.stateDir = filepath.Join(t.TempDir(), "state") // tmpfs in the VM
	e.start("a")
	e.waitPrimary("a", 60*time.Second)
	c := e.client()
	cx := ctx(t, 2*time.Minute)
	_, err := c.Claim(cx, "sb", claimReq("claim-sb-1", 1))
	if errdefs.CodeOf(err) != errdefs.CodeUnavailable || !strings.Contains(err.Error(), "disk lease cannot be enforced") || !strings.Contains(err.Error(), "tmpfs") {
		t.Fatalf("claim on a tmpfs scratch: %v; want unavailable: disk lease cannot be enforced ... tmpfs", err)
	}
	if _, err := c.Get(cx, "sb"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("refused claim left a record: %v", err)
	}
	out, err := exec.Command(e.bin, "doctor", "--state-dir", e.stateDir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "FAIL scratch disk quota") || !strings.Contains(string(out), "prjquota") {
		t.Fatalf("ctld doctor on a tmpfs state dir (%v):\n%s\nwant FAIL scratch disk quota with a fix", err, out)
	}
	out, _ = exec.Command(e.bin, "doctor", "--state-dir", filepath.Join(ktest.QuotaDir(t), "state")).CombinedOutput()
	if !strings.Contains(string(out), "ok   scratch disk quota") {
		t.Fatalf("ctld doctor on the XFS prjquota state disk:\n%s\nwant ok scratch disk quota", out)
	}
}

func freeBytes(t *testing.T, dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

func hasCheck(p api.CleanupProof, name string) bool {
	for _, c := range p.Checks {
		if c.Name == name {
			return c.OK
		}
	}
	return false
}
