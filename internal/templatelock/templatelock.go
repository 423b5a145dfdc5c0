// Package templatelock is the lock shared by ctld's overlay claims and
// `template rm` over a templates directory (ctld's TemplatesDir): a claim
// holds it shared while it mounts an overlay over a template's tree, a
// removal holds it exclusive while it checks that no overlay uses the
// tree and renames the tree aside. So a removal either sees the claim's
// overlay in the mount table (and refuses), or the claim finds the tree
// gone (and fails cleanly): never a tree removed under a mount being
// made.
//
// The lock is the file .lock in the directory (not a template name: a
// name never starts with a dot), made on first use and never removed, so
// every holder locks the same inode (flock(2)).
package templatelock

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Name is the lock file's name in the templates directory.
const Name = ".lock"

// Shared takes the lock of templates directory dir shared (an overlay
// mount being made); the returned func releases it.
func Shared(ctx context.Context, dir string) (func(), error) { return lock(ctx, dir, unix.LOCK_SH) }

// Exclusive takes the lock of templates directory dir exclusively (a tree
// being removed); the returned func releases it.
func Exclusive(ctx context.Context, dir string) (func(), error) {
	return lock(ctx, dir, unix.LOCK_EX)
}

func lock(ctx context.Context, dir string, how int) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, Name), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open templates lock: %w", err)
	}
	// A blocking flock does not see ctx: take it in a goroutine so a
	// cancelled caller stops waiting (the lock, if it comes, is dropped).
	got := make(chan error, 1)
	go func() { got <- unix.Flock(int(f.Fd()), how) }()
	select {
	case err := <-got:
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock templates: %w", err)
		}
		return func() { f.Close() }, nil
	case <-ctx.Done():
		go func() { <-got; f.Close() }()
		return nil, fmt.Errorf("lock templates: %w", ctx.Err())
	}
}
