package ktest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/diskquota"
	"github.com/ctld/ctld/internal/mountinfo"
)

// LoopFS makes a filesystem of the given type (e.g. "xfs") on a sparse
// image in a temp dir, mounts it through a loop device with the mount
// options (e.g. "prjquota"), and unmounts it (which frees the loop device)
// when the test ends. It returns the mount point.
func LoopFS(t testing.TB, fstype string, sizeMiB int64, options string) string {
	t.Helper()
	Require(t)
	mkfs := RequireBinary(t, "mkfs."+fstype)
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(sizeMiB << 20)
		f.Close()
	}
	if err != nil {
		t.Fatalf("make sparse image: %v", err)
	}
	args := []string{"-q", img}
	if fstype == "ext4" {
		args = []string{"-q", "-O", "quota,project", img}
	}
	if out, err := exec.Command(mkfs, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", mkfs, strings.Join(args, " "), err, out)
	}
	opts := "loop"
	if options != "" {
		opts += "," + options
	}
	if out, err := exec.Command("mount", "-t", fstype, "-o", opts, img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount %s -o %s: %v\n%s", fstype, opts, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", mnt, err, out)
		}
	})
	return mnt
}

// QuotaDir returns a fresh directory on a filesystem that enforces project
// quotas (the test VM's /var/lib/ctld, XFS mounted with prjquota), removed
// when the test ends. It fails if there is none.
func QuotaDir(t testing.TB) string {
	t.Helper()
	Require(t)
	const base = "/var/lib/ctld"
	st, err := diskquota.Probe(base)
	if err != nil || !st.Bounded() {
		t.Fatalf("%s cannot bound disk use with project quotas (%+v, %v): the test VM mounts it as XFS with prjquota", base, st, err)
	}
	dir, err := os.MkdirTemp(base, strings.ReplaceAll(t.Name(), "/", "_")+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	return dir
}

// projectQuotas lists, per mounted filesystem that accounts project
// quotas, the projects that hold a limit or usage, as "mountpoint:id".
// The root project (0, everything not in a project) is left out.
func projectQuotas() ([]string, error) {
	ms, err := mountinfo.ReadFile(mountinfo.SelfPath)
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{} // one line per filesystem, not per bind mount
	for _, m := range ms {
		if seen[fmt.Sprint(m.Major, ":", m.Minor)] || !strings.Contains(m.SuperOptions, "prjquota") && !strings.Contains(m.SuperOptions, "pquota") {
			continue
		}
		seen[fmt.Sprint(m.Major, ":", m.Minor)] = true
		qs, err := diskquota.List(m.MountPoint, 1, ^uint32(0))
		if err != nil {
			return nil, fmt.Errorf("list project quotas of %s: %w", m.MountPoint, err)
		}
		for _, q := range qs {
			out = append(out, fmt.Sprintf("%s:project %d", m.MountPoint, q.ID))
		}
	}
	return out, nil
}

// attachedLoops lists loop devices with a backing file.
func attachedLoops() []string {
	var out []string
	for _, d := range dirNames("/sys/block") {
		if !strings.HasPrefix(d, "loop") {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/sys/block", d, "loop", "backing_file")); err == nil {
			out = append(out, d+"("+strings.TrimSpace(string(b))+")")
		}
	}
	return out
}
