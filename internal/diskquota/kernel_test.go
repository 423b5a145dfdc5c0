package diskquota_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/diskquota"
	"github.com/ctld/ctld/internal/ktest"
)

// fill writes zeros to path until the kernel refuses, and returns how many
// bytes were written and the error that stopped it.
func fill(t *testing.T, path string) (int64, error) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 64<<10)
	var n int64
	for {
		w, err := f.Write(buf)
		n += int64(w)
		if err != nil {
			f.Close()
			return n, err
		}
		if n > 1<<30 {
			f.Close()
			return n, io.ErrShortWrite // unbounded: the limit did not hold
		}
	}
}

// TestKernelProjectQuotaBoundsATree: on XFS (prjquota) a dir with a
// project and PROJINHERIT bounds every file written below it, including in
// subdirs made later, even for root: writes stop at the limit with ENOSPC;
// List and Get see the project; once the files are gone and the limit
// cleared it is empty. On ext4 (project feature, prjquota) the same limit
// does not stop root (the generic quota code exempts CAP_SYS_RESOURCE), so
// Probe must not call it bounded.
func TestKernelProjectQuotaBoundsATree(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	for _, fstype := range []string{"xfs", "ext4"} {
		t.Run(fstype, func(t *testing.T) {
			mnt := ktest.LoopFS(t, fstype, 320, "prjquota")
			st, err := diskquota.Probe(mnt)
			if err != nil || !st.Accounting || !st.Enforcing || st.FSType != fstype || st.Bounded() != (fstype == "xfs") {
				t.Fatalf("Probe(%s) = %+v, %v; want %s enforcing project quotas, bounded for root only on xfs", mnt, st, err, fstype)
			}
			dir := filepath.Join(mnt, "sb")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			const id, limit = 4242, 8 << 20
			if err := diskquota.SetProject(dir, id); err != nil {
				t.Fatal(err)
			}
			if got, inherit, err := diskquota.Project(dir); err != nil || got != id || !inherit {
				t.Fatalf("diskquota.Project(%s) = %d, %v, %v; want %d with PROJINHERIT", dir, got, inherit, err, id)
			}
			if err := diskquota.SetLimit(mnt, id, limit, 100); err != nil {
				t.Fatal(err)
			}
			q, err := diskquota.Get(mnt, id)
			if err != nil || q.LimitBytes != limit || q.LimitInodes != 100 {
				t.Fatalf("Get = %+v, %v; want limit %d bytes, 100 inodes", q, err, limit)
			}
			sub := filepath.Join(dir, "a", "b")
			if err := os.MkdirAll(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			if got, inherit, _ := diskquota.Project(sub); got != id || !inherit {
				t.Fatalf("subdir project %d inherit %v, want %d inherited", got, inherit, id)
			}
			n, err := fill(t, filepath.Join(sub, "fill"))
			if fstype == "ext4" {
				// Root (this test) is not bound: the write runs on until the
				// filesystem is full, far past the limit.
				if n <= limit {
					t.Fatalf("ext4: root stopped at %d bytes (%v) under a %d-byte project limit; Probe calls ext4 root-exempt", n, err, limit)
				}
				t.Logf("ext4: root wrote %d bytes under a %d-byte project limit (%v): not a bound", n, limit, err)
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
				if err := diskquota.SetLimit(mnt, id, 0, 0); err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, unix.ENOSPC) && !errors.Is(err, unix.EDQUOT) {
				t.Fatalf("write stopped after %d bytes with %v; want ENOSPC or EDQUOT", n, err)
			}
			// The limit counts blocks of the dirs too, so a little less than
			// the limit fits, never more.
			if n > limit || n < limit-256<<10 {
				t.Fatalf("wrote %d bytes under a %d-byte limit; want within 256 KiB below it", n, limit)
			}
			t.Logf("%s: wrote %d bytes under a %d-byte limit, stopped by %v", fstype, n, limit, err)
			var sfs unix.Statfs_t
			if err := unix.Statfs(mnt, &sfs); err != nil || int64(sfs.Bavail)*sfs.Bsize < 200<<20 {
				t.Fatalf("filesystem has %d bytes free after the bounded write (%v); want most of it", int64(sfs.Bavail)*sfs.Bsize, err)
			}
			qs, err := diskquota.List(mnt, 1, ^uint32(0))
			if err != nil || len(qs) != 1 || qs[0].ID != id || qs[0].UsedBytes < limit-256<<10 {
				t.Fatalf("List = %+v, %v; want project %d using about %d bytes", qs, err, id, limit)
			}
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := diskquota.SetLimit(mnt, id, 0, 0); err != nil {
				t.Fatal(err)
			}
			// XFS frees unlinked inodes in the background.
			for i := 0; ; i++ {
				if q, err = diskquota.Get(mnt, id); err == nil && q.Empty() {
					break
				}
				if i == 100 {
					t.Fatalf("project %d not empty after removal and clearing: %+v, %v", id, q, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if qs, err := diskquota.List(mnt, 1, ^uint32(0)); err != nil || len(qs) != 0 {
				t.Fatalf("List after clearing = %+v, %v; want none", qs, err)
			}
		})
	}
}

// TestKernelProbeRefusesUnboundedFilesystems: XFS without prjquota, XFS
// accounting but not enforcing (pqnoenforce), and tmpfs cannot bound a
// tree, and Probe says why.
func TestKernelProbeRefusesUnboundedFilesystems(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	for _, c := range []struct {
		name, opts string
		acct       bool
	}{{"xfs without prjquota", "", false}, {"xfs pqnoenforce", "pqnoenforce", true}} {
		t.Run(c.name, func(t *testing.T) {
			mnt := ktest.LoopFS(t, "xfs", 320, c.opts)
			st, err := diskquota.Probe(mnt)
			if err != nil || st.Bounded() || st.Accounting != c.acct || st.Detail == "" {
				t.Fatalf("Probe = %+v, %v; want not bounded (accounting %v) with a reason", st, err, c.acct)
			}
			t.Logf("%s: %s", c.name, st.Detail)
		})
	}
	st, err := diskquota.Probe(t.TempDir())
	if err != nil || st.Bounded() || st.FSType != "tmpfs" || st.Detail == "" {
		t.Fatalf("diskquota.Probe(tmpfs) = %+v, %v; want tmpfs, not bounded, with a reason", st, err)
	}
	t.Logf("tmpfs: %s", st.Detail)
}
