// Package rootfs makes the writable root filesystem of a sandbox. Overlay
// mode (this file) stacks a per-sandbox upper and work dir on scratch over
// a read-only template dir; the merged dir becomes the OCI root and is
// thrown away with the sandbox.
package rootfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/mountinfo"
	"github.com/ctld/ctld/internal/names"
)

// Mount is a mount described as plain data, so it can be unit-tested and
// logged before it is made.
type Mount struct {
	Source  string
	Target  string
	FSType  string
	Options []string
}

// Data is the option string passed to mount(2).
func (m Mount) Data() string { return strings.Join(m.Options, ",") }

// Overlay mounts per-sandbox overlay roots. Each sandbox owns
// <ScratchDir>/<id>/ with upper/, work/ and root/ (the merged mount).
type Overlay struct {
	// ScratchDir holds the per-sandbox dirs, e.g. /var/lib/ctld/scratch.
	// It must be on a filesystem that can be an overlay upper (tmpfs,
	// ext4, xfs), not on overlayfs itself.
	ScratchDir string
	Logger     *slog.Logger
	// MountinfoPath is where mounts are read from; empty means
	// mountinfo.SelfPath.
	MountinfoPath string
	// ProcRoot is where every process's mounts and files are looked at
	// for the cleanup proof; empty means /proc.
	ProcRoot string
}

// Sub-directories of a sandbox's scratch dir.
const (
	upperName = "upper"
	workName  = "work"
	rootName  = "root"
)

// Bounded EBUSY retries before a lazy detach (about 1 s in total).
const (
	busyRetries = 10
	busyDelay   = 100 * time.Millisecond
)

func (o *Overlay) logger() *slog.Logger {
	return logging.OrDiscard(o.Logger)
}

func (o *Overlay) mountinfo() ([]mountinfo.Mount, error) { return readMounts(o.MountinfoPath) }

// scratch is ScratchDir with symlinks resolved.
func (o *Overlay) scratch() string { return resolvedDir(o.ScratchDir) }

// Dir is the sandbox's scratch dir.
func (o *Overlay) Dir(id string) string { return filepath.Join(o.scratch(), id) }

// Plan describes the overlay mount of sandbox id over lower, without
// touching anything.
func (o *Overlay) Plan(id, lower string) Mount {
	dir := o.Dir(id)
	return Mount{
		Source: "overlay",
		Target: filepath.Join(dir, rootName),
		FSType: "overlay",
		Options: []string{
			"lowerdir=" + filepath.Clean(lower),
			"upperdir=" + filepath.Join(dir, upperName),
			"workdir=" + filepath.Join(dir, workName),
		},
	}
}

// CheckOverlayPath refuses paths that overlayfs would read differently
// from what we mean: its option parser splits on ',' and lowerdir on ':',
// and mountinfo escapes whitespace and '\'.
func CheckOverlayPath(kind, p string) error {
	if !filepath.IsAbs(p) {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "%s %q must be absolute", kind, p)
	}
	if i := strings.IndexAny(p, ",:\\ \t\n\x00"); i >= 0 {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "%s %q contains %q, which overlayfs options cannot carry", kind, p, p[i])
	}
	return nil
}

// Mount makes the overlay root of sandbox id over the template dir lower
// and returns the merged dir. It is idempotent: an overlay already mounted
// there with the same lowerdir is success.
func (o *Overlay) Mount(ctx context.Context, id, lower string) (root string, err error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return "", err
	}
	if err := CheckOverlayPath("template dir", lower); err != nil {
		return "", err
	}
	if err := CheckOverlayPath("scratch dir", o.ScratchDir); err != nil {
		return "", err
	}
	lowerInfo, err := os.Stat(lower)
	if err != nil {
		return "", fmt.Errorf("stat template dir: %w", err)
	} else if !lowerInfo.IsDir() {
		return "", errdefs.Errorf(errdefs.CodeInvalidArgument, "template %q is not a directory", lower)
	}
	if err := os.MkdirAll(o.ScratchDir, 0o700); err != nil {
		return "", fmt.Errorf("make scratch dir: %w", err)
	}
	if err := checkUpperFS(o.ScratchDir); err != nil {
		return "", err
	}
	m := o.Plan(id, lower)
	log := o.logger().With("sandbox", id, "root", m.Target)

	mounted, err := o.mountedOverlay(m)
	if err != nil {
		return "", err
	}
	if mounted {
		log.Debug("overlay already mounted")
		return m.Target, nil
	}
	dir := o.Dir(id)
	// 0700: the guest's files must not be readable by other host users.
	for _, d := range []string{dir, filepath.Join(dir, upperName), filepath.Join(dir, workName), m.Target} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("make dir %s: %w", d, err)
		}
	}
	// The merged root takes the upper dir's mode, and the guest sees it as
	// its "/": give it the template root's, or a non-root workload cannot
	// even reach /bin. dir (0700) still keeps other host users out.
	if err := os.Chmod(filepath.Join(dir, upperName), lowerInfo.Mode().Perm()); err != nil {
		return "", fmt.Errorf("set mode of upper dir: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("mount overlay: %w", err)
	}
	if err := unix.Mount(m.Source, m.Target, m.FSType, 0, m.Data()); err != nil {
		err = fmt.Errorf("mount overlay %s (%s): %w", m.Target, m.Data(), err)
		// Roll back the dirs so a failed claim leaves nothing behind.
		return "", errors.Join(err, o.Unmount(ctx, id))
	}
	log.Info("overlay mounted", "lower", lower)
	return m.Target, nil
}

// mountedOverlay reports whether m is already mounted: an overlay at the
// target with the same lowerdir. Anything else at the target is a conflict
// the caller must clean up first.
func (o *Overlay) mountedOverlay(m Mount) (bool, error) {
	ms, err := o.mountinfo()
	if err != nil {
		return false, err
	}
	at := mountinfo.At(ms, m.Target)
	if len(at) == 0 {
		return false, nil
	}
	top := at[len(at)-1]
	want, _ := mountinfo.Option(m.Data(), "lowerdir")
	have, _ := mountinfo.Option(top.SuperOptions, "lowerdir")
	if top.FSType != "overlay" || have != want {
		return false, errdefs.Errorf(errdefs.CodeConflict, "%s is already mounted (%s, lowerdir=%q), want overlay over %q", m.Target, top.FSType, have, want)
	}
	return true, nil
}

// checkUpperFS refuses scratch on overlayfs, which the kernel does not
// accept as an upper dir; the clear error beats mount's EINVAL.
func checkUpperFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs scratch dir %s: %w", dir, err)
	}
	if st.Type == unix.OVERLAYFS_SUPER_MAGIC {
		return fmt.Errorf("scratch dir %s is on overlayfs, which cannot hold an overlay upper dir; use tmpfs, ext4 or xfs", dir)
	}
	return nil
}

// Unmount removes sandbox id's overlay and its scratch dir. It is
// idempotent: nothing mounted and no dir is success. Every mount under the
// scratch dir goes (deepest first) before the dir is removed, so the
// removal can never walk into a mounted filesystem.
func (o *Overlay) Unmount(ctx context.Context, id string) error {
	if err := names.CheckID("sandbox id", id); err != nil {
		return err
	}
	dir := o.Dir(id)
	log := o.logger().With("sandbox", id, "dir", dir)
	// Removing the dir is safe only if nothing is left mounted in it.
	left, err := unmountUnder(ctx, log, o.mountinfo, dir)
	if err != nil {
		return err
	}
	if left != "" {
		return fmt.Errorf("unmount overlay %s: %s still mounted", id, left)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove scratch dir %s: %w", dir, err)
	}
	log.Info("overlay removed")
	return nil
}

// unmountBusy unmounts target; not mounted (EINVAL) or missing (ENOENT)
// is success. EBUSY is retried a bounded number of times, then the mount
// is lazily detached as a last resort and that is logged as a warning: the
// filesystem may live on until its last user goes.
func unmountBusy(ctx context.Context, log *slog.Logger, target string) error {
	for i := 0; ; i++ {
		err := unix.Unmount(target, 0)
		switch {
		case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		case !errors.Is(err, unix.EBUSY):
			return fmt.Errorf("unmount %s: %w", target, err)
		}
		if i == busyRetries {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("unmount %s: busy: %w", target, ctx.Err())
		case <-time.After(busyDelay):
		}
	}
	log.Warn("mount still busy after retries, detaching lazily", "target", target, "retries", busyRetries)
	if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("detach %s: %w", target, err)
	}
	return nil
}

// List returns the sandbox ids that have a scratch dir or a mount under
// ScratchDir, sorted, for the reconciler. Entries whose names are not
// valid ids are logged and left alone: ctld never made them.
func (o *Overlay) List(ctx context.Context) ([]string, error) {
	scratch := o.scratch()
	ms, err := o.mountinfo()
	if err != nil {
		return nil, err
	}
	ids, foreign, err := listIDs(scratch, ms)
	if err != nil {
		return nil, fmt.Errorf("list scratch dir: %w", err)
	}
	for _, name := range foreign {
		o.logger().Warn("ignoring foreign entry in scratch dir", "name", name, "dir", scratch)
	}
	return ids, nil
}

// Mounted returns the sandbox ids whose overlay root is mounted, sorted,
// from one read of the mount table: the reconciler's inventory, which must
// not parse mountinfo once per sandbox.
func (o *Overlay) Mounted(ctx context.Context) ([]string, error) {
	ms, err := o.mountinfo()
	if err != nil {
		return nil, err
	}
	scratch := o.scratch()
	var out []string
	for _, m := range mountinfo.Under(ms, scratch) {
		rel, err := filepath.Rel(scratch, m.MountPoint)
		if err != nil {
			continue
		}
		id, rest, _ := strings.Cut(rel, "/")
		if rest == rootName && m.FSType == "overlay" && names.CheckID("sandbox id", id) == nil && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out, nil
}

// CheckGone is the overlay part of the cleanup proof: no mount at or under
// the sandbox's scratch dir, the dir itself absent, and the overlay's
// superblock (dev, from Superblock; "" when unknown) gone: mounted in no
// mount namespace and, after a lazy detach, held by no process. detail
// says what was seen either way, naming a holder's pid.
func (o *Overlay) CheckGone(ctx context.Context, id, dev string) (ok bool, detail string) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return false, err.Error()
	}
	dir := o.Dir(id)
	if ok, detail := checkPathGone(o.mountinfo, dir, "dir"); !ok {
		return false, detail
	}
	ok, sb := o.checkSuperblockGone(id, dev)
	if !ok {
		return false, sb
	}
	return true, fmt.Sprintf("no mounts under %s and the dir is gone; %s", dir, sb)
}
