package rootfs

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ctld/ctld/internal/holders"
	"github.com/ctld/ctld/internal/mountinfo"
	"github.com/ctld/ctld/internal/names"
)

// Superblock is the device number ("major:minor", as mountinfo shows it)
// of sandbox id's mounted overlay, which the cleanup proof needs once the
// mount point is gone: a lazily detached overlay lives on, invisible in
// this namespace's mountinfo, while a process has its cwd or a file in it
// or another mount namespace still has a copy of the mount.
func (o *Overlay) Superblock(id string) (string, error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return "", err
	}
	ms, err := o.mountinfo()
	if err != nil {
		return "", err
	}
	target := filepath.Join(o.Dir(id), rootName)
	at := mountinfo.At(ms, target)
	if len(at) == 0 || at[len(at)-1].FSType != "overlay" {
		return "", fmt.Errorf("no overlay mounted at %s", target)
	}
	top := at[len(at)-1]
	return fmt.Sprintf("%d:%d", top.Major, top.Minor), nil
}

func (o *Overlay) proc() string { return procRoot(o.ProcRoot) }

// checkSuperblockGone looks for sandbox id's overlay superblock in every
// mount namespace and, when its device number dev is known, for processes
// that hold it by cwd, root or an open file. The overlay is recognised by
// its upperdir (a per-generation path), so a device number the kernel has
// reused for another filesystem is not mistaken for it.
func (o *Overlay) checkSuperblockGone(id, dev string) (ok bool, detail string) {
	upper := filepath.Join(o.Dir(id), upperName)
	n, reused, mounted := o.scanMounts(upper, dev)
	if mounted != "" {
		return false, mounted
	}
	where := fmt.Sprintf("in none of %d mount namespaces", n)
	if dev == "" {
		return true, fmt.Sprintf("overlay (upperdir %s) mounted %s; superblock device not recorded, holders not checked", upper, where)
	}
	if reused {
		// Device numbers are unique among live superblocks: another
		// filesystem has ours, so ours is gone.
		return true, fmt.Sprintf("overlay superblock %s mounted %s; the device now belongs to another filesystem", dev, where)
	}
	held, err := holdersOf(o.proc(), dev)
	if err != nil {
		return false, err.Error()
	}
	if held != "" {
		// The device may have been freed and given to a new filesystem
		// between the scan and the holders' (a guest's root mounted
		// meanwhile, in a namespace of its own): look again.
		if _, reused, mounted := o.scanMounts(upper, dev); mounted == "" && reused {
			return true, fmt.Sprintf("overlay superblock %s mounted %s; the device now belongs to another filesystem (its holders' %s)", dev, where, held)
		}
		return false, fmt.Sprintf("overlay superblock %s is detached but alive: held by %s", dev, held)
	}
	return true, fmt.Sprintf("overlay superblock %s mounted %s and held by no process", dev, where)
}

// scanMounts reads every mount namespace: n of them; reused says a
// filesystem other than the overlay of upperdir upper has device dev;
// mounted, when not empty, says where that overlay is still mounted (or
// that the namespaces could not be read).
func (o *Overlay) scanMounts(upper, dev string) (n int, reused bool, mounted string) {
	nss, err := mountinfo.AllNamespaces(o.proc())
	if err != nil {
		return 0, false, fmt.Sprintf("cannot read the mounts of every namespace: %v", err)
	}
	for _, ns := range nss {
		for _, m := range ns.Mounts {
			ud, _ := mountinfo.Option(m.SuperOptions, "upperdir")
			if m.FSType == "overlay" && ud == upper {
				return len(nss), false, fmt.Sprintf("overlay superblock %d:%d (upperdir %s) still mounted at %s in mount namespace %s (pid %d)", m.Major, m.Minor, upper, m.MountPoint, ns.ID, ns.PID)
			}
			if dev != "" && fmt.Sprintf("%d:%d", m.Major, m.Minor) == dev {
				reused = true
			}
		}
	}
	return len(nss), reused, ""
}

func parseDev(dev string) (uint32, uint32, error) {
	a, b, ok := strings.Cut(dev, ":")
	maj, err1 := strconv.ParseUint(a, 10, 32)
	min, err2 := strconv.ParseUint(b, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("bad device number %q: want major:minor", dev)
	}
	return uint32(maj), uint32(min), nil
}

// refList names at most a few holders, so a proof's detail stays short.
func refList(refs []holders.Ref) string {
	const most = 4
	var s []string
	for i, r := range refs {
		if i == most {
			s = append(s, fmt.Sprintf("and %d more", len(refs)-most))
			break
		}
		s = append(s, r.String())
	}
	return strings.Join(s, ", ")
}
