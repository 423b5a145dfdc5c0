package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/ctld/ctld/internal/diskquota"
	"github.com/ctld/ctld/internal/ha"
)

// stateChecks are the requirements on the state dir's filesystems: a local
// flock for the election and the journal, and project quotas on the
// scratch filesystem for disk leases.
func stateChecks(stateDir string) []check {
	var out []check
	dir := existingParent(stateDir)
	c := check{name: "state dir local lock", fix: "put the state dir on a local filesystem (ext4, xfs, btrfs, tmpfs), not NFS, SMB, 9p or FUSE"}
	if err := ha.CheckLocalLock(dir); err != nil {
		c.detail = err.Error()
	} else {
		c.ok, c.detail = true, dir+": flock is a local kernel lock"
	}
	out = append(out, c)

	scratch := existingParent(filepath.Join(stateDir, "scratch"))
	c = check{name: "scratch disk quota", fix: "mount an XFS filesystem with -o prjquota at " + filepath.Join(stateDir, "scratch") + " (or at the state dir); ext4 project quotas do not bind root"}
	if st, err := diskquota.Probe(scratch); err != nil {
		c.detail = err.Error()
	} else if !st.Bounded() {
		c.detail = fmt.Sprintf("%s: %s: disk leases cannot be enforced, claims are refused", scratch, st.Detail)
	} else {
		c.ok, c.detail = true, fmt.Sprintf("%s: %s enforces project quotas", scratch, st.FSType)
	}
	return append(out, c)
}

// existingParent is dir or its nearest existing parent, so doctor can
// judge a filesystem before ctld made its dirs there.
func existingParent(dir string) string {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil || d == filepath.Dir(d) {
			return d
		}
	}
}
