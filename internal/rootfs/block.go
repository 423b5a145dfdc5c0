package rootfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/mountinfo"
	"github.com/ctld/ctld/internal/names"
)

// Block mounts the filesystem of a block-mode generation's NBD device
// (ext4, made by the template import) at <Dir>/<id>: the OCI root. The
// device itself is the writer's (internal/writer); this is only the mount.
type Block struct {
	// Dir holds one mount point per generation, e.g.
	// /var/lib/ctld/blockroot (0700: the guests' files are not other host
	// users' to read).
	Dir    string
	Logger *slog.Logger
	// MountinfoPath and ProcRoot as Overlay's.
	MountinfoPath string
	ProcRoot      string
}

// BlockFSType is the filesystem of block-mode templates.
const BlockFSType = "ext4"

var nbdDevice = regexp.MustCompile(`^/dev/nbd[0-9]{1,4}$`)

func (b *Block) logger() *slog.Logger { return logging.OrDiscard(b.Logger) }

func (b *Block) mountinfo() ([]mountinfo.Mount, error) { return readMounts(b.MountinfoPath) }

func (b *Block) proc() string { return procRoot(b.ProcRoot) }

// dir is Dir with symlinks resolved, as mountinfo shows paths.
func (b *Block) dir() string { return resolvedDir(b.Dir) }

// Target is generation id's mount point.
func (b *Block) Target(id string) string { return filepath.Join(b.dir(), id) }

// Plan describes the mount of device for generation id as data.
func (b *Block) Plan(id, device string) Mount {
	return Mount{Source: device, Target: b.Target(id), FSType: BlockFSType}
}

// Mount mounts device at id's mount point and returns it. Idempotent: the
// same device mounted there is success; anything else there a conflict.
func (b *Block) Mount(ctx context.Context, id, device string) (string, error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return "", err
	}
	if !nbdDevice.MatchString(device) {
		return "", errdefs.Errorf(errdefs.CodeInvalidArgument, "block device %q is not an NBD device (/dev/nbdN)", device)
	}
	if !filepath.IsAbs(b.Dir) {
		return "", errdefs.Errorf(errdefs.CodeInvalidArgument, "block mount dir %q must be absolute", b.Dir)
	}
	if err := os.MkdirAll(b.Dir, 0o700); err != nil {
		return "", fmt.Errorf("make block mount dir: %w", err)
	}
	m := b.Plan(id, device)
	ms, err := b.mountinfo()
	if err != nil {
		return "", err
	}
	if at := mountinfo.At(ms, m.Target); len(at) > 0 {
		top := at[len(at)-1]
		if top.FSType == m.FSType && top.Source == device {
			return m.Target, nil
		}
		return "", errdefs.Errorf(errdefs.CodeConflict, "%s is already mounted (%s from %s), want %s from %s", m.Target, top.FSType, top.Source, m.FSType, device)
	}
	if err := os.Mkdir(m.Target, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("make mount point %s: %w", m.Target, err)
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("mount %s: %w", device, err)
	}
	// nodev: the guest's image must not give the host device nodes.
	if err := unix.Mount(m.Source, m.Target, m.FSType, unix.MS_NODEV, ""); err != nil {
		err = fmt.Errorf("mount %s (%s) at %s: %w", device, m.FSType, m.Target, err)
		return "", errors.Join(err, b.Unmount(ctx, id))
	}
	b.logger().Info("block root mounted", "sandbox", id, "device", device, "root", m.Target)
	return m.Target, nil
}

// Unmount unmounts id's root (bounded EBUSY retries, then a lazy detach,
// as the overlay's) and removes the mount point; absent is success.
func (b *Block) Unmount(ctx context.Context, id string) error {
	if err := names.CheckID("sandbox id", id); err != nil {
		return err
	}
	target := b.Target(id)
	log := b.logger().With("sandbox", id, "root", target)
	// A primary that died between a freeze and its thaw left the
	// filesystem frozen: its unmount would wait for a thaw forever.
	if err := b.Thaw(ctx, id); err != nil {
		log.Warn("thaw before unmount", "err", err)
	}
	left, err := unmountUnder(ctx, log, b.mountinfo, target)
	if err != nil {
		return err
	}
	if left != "" {
		return fmt.Errorf("unmount block root %s: %s still mounted", id, left)
	}
	// Remove, not RemoveAll: an unmounted mount point is empty, and
	// anything in it is not ours to delete.
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove mount point %s: %w", target, err)
	}
	return nil
}

// List returns the ids with a mount point or a mount under Dir.
func (b *Block) List(ctx context.Context) ([]string, error) {
	ms, err := b.mountinfo()
	if err != nil {
		return nil, err
	}
	ids, _, err := listIDs(b.dir(), ms)
	if err != nil {
		return nil, fmt.Errorf("list block mount dir: %w", err)
	}
	return ids, nil
}

// Mounted returns the ids whose root is mounted, from one mountinfo read.
func (b *Block) Mounted(ctx context.Context) ([]string, error) {
	ms, err := b.mountinfo()
	if err != nil {
		return nil, err
	}
	dir := b.dir()
	var out []string
	for _, m := range mountinfo.Under(ms, dir) {
		if filepath.Dir(m.MountPoint) == dir && m.FSType == BlockFSType {
			if id := filepath.Base(m.MountPoint); names.CheckID("sandbox id", id) == nil && !slices.Contains(out, id) {
				out = append(out, id)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// Superblock is the device (major:minor) of id's mounted root.
func (b *Block) Superblock(id string) (string, error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return "", err
	}
	ms, err := b.mountinfo()
	if err != nil {
		return "", err
	}
	at := mountinfo.At(ms, b.Target(id))
	if len(at) == 0 {
		return "", fmt.Errorf("nothing mounted at %s", b.Target(id))
	}
	top := at[len(at)-1]
	return fmt.Sprintf("%d:%d", top.Major, top.Minor), nil
}

// CheckGone is the block root's part of the cleanup proof: nothing mounted
// at the mount point, the mount point gone, and (dev known) the device's
// filesystem mounted in no mount namespace and held by no process.
func (b *Block) CheckGone(ctx context.Context, id, dev string) (bool, string) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return false, err.Error()
	}
	target := b.Target(id)
	if ok, detail := checkPathGone(b.mountinfo, target, "mount point"); !ok {
		return false, detail
	}
	if dev == "" {
		return true, fmt.Sprintf("nothing mounted at %s and it is gone; device not recorded, holders not checked", target)
	}
	nss, err := mountinfo.AllNamespaces(b.proc())
	if err != nil {
		return false, fmt.Sprintf("cannot read the mounts of every namespace: %v", err)
	}
	for _, ns := range nss {
		for _, m := range ns.Mounts {
			if fmt.Sprintf("%d:%d", m.Major, m.Minor) == dev {
				return false, fmt.Sprintf("device %s (%s) still mounted at %s in mount namespace %s (pid %d)", dev, m.Source, m.MountPoint, ns.ID, ns.PID)
			}
		}
	}
	held, err := holdersOf(b.proc(), dev)
	if err != nil {
		return false, err.Error()
	}
	if held != "" {
		return false, fmt.Sprintf("filesystem of device %s is detached but alive: held by %s", dev, held)
	}
	return true, fmt.Sprintf("nothing mounted at %s and it is gone; device %s mounted in none of %d mount namespaces and held by no process", target, dev, len(nss))
}
