package rootfs_test

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/node/overlay/rootfstest"
	"github.com/ctld/ctld/internal/rootfs"
)

// TestKernelRootFSContract: *rootfs.Overlay over a real overlayfs, its
// scratch on an XFS with project quotas, keeps the root filesystem
// contract the fake kernel keeps on the host (node/fakekernel
// TestRootFSContract). Each case gets a scratch dir and a project of its
// own on one loop filesystem; nothing is left after the suite.
func TestKernelRootFSContract(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	mnt := ktest.LoopFS(t, "xfs", 320, "prjquota")
	n := uint32(0)
	rootfstest.Run(t, func(t *testing.T) rootfstest.Subject {
		n++
		project := 77200 + 10*n
		return rootfstest.Subject{
			RootFS:  &rootfs.Overlay{ScratchDir: filepath.Join(mnt, fmt.Sprintf("scratch%d", n)), Logger: slog.New(slog.NewTextHandler(t.Output(), nil))},
			Project: project, ProjectTo: project + 10,
		}
	})
}
