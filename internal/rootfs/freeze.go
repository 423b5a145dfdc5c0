package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/mountinfo"
	"github.com/ctld/ctld/internal/names"
)

// The filesystem freeze ioctls (linux/fs.h: _IOWR('X', 119, int) and
// _IOWR('X', 120, int)); x/sys/unix does not define them.
const (
	ioctlFIFREEZE = 0xC0045877
	ioctlFITHAW   = 0xC0045878
)

// Freeze freezes the filesystem mounted as id's block root (FIFREEZE):
// the kernel writes its dirty data to the device and new writes wait
// until thaw, which the caller must call (it is idempotent). A freeze
// outlives its caller: a primary that dies frozen leaves the guest's
// writes waiting until the next one thaws (Thaw on takeover, Unmount).
func (b *Block) Freeze(ctx context.Context, id string) (thaw func() error, err error) {
	f, err := b.openRoot(id)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		f.Close()
		return nil, fmt.Errorf("freeze block root %s: %w", id, err)
	}
	if err := unix.IoctlSetInt(int(f.Fd()), ioctlFIFREEZE, 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("freeze block root %s (FIFREEZE): %w", id, err)
	}
	done := false
	return func() error {
		if done {
			return nil
		}
		done = true
		defer f.Close()
		if err := unix.IoctlSetInt(int(f.Fd()), ioctlFITHAW, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("thaw block root %s (FITHAW): %w", id, err)
		}
		return nil
	}, nil
}

// Thaw thaws id's block root if it is frozen; not frozen (EINVAL) and not
// mounted are success.
func (b *Block) Thaw(ctx context.Context, id string) error {
	f, err := b.openRoot(id)
	if errdefs.CodeOf(err) == errdefs.CodeNotFound {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), ioctlFITHAW, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("thaw block root %s (FITHAW): %w", id, err)
	}
	return nil
}

// openRoot opens id's mounted block root (not_found when nothing of ours
// is mounted there).
func (b *Block) openRoot(id string) (*os.File, error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return nil, err
	}
	target := b.Target(id)
	ms, err := b.mountinfo()
	if err != nil {
		return nil, err
	}
	at := mountinfo.At(ms, target)
	if len(at) == 0 || !nbdDevice.MatchString(at[len(at)-1].Source) {
		return nil, errdefs.Errorf(errdefs.CodeNotFound, "no block root mounted at %s", target)
	}
	f, err := os.OpenFile(target, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("open block root %s: %w", target, err)
	}
	return f, nil
}
