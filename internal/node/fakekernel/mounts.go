package fakekernel

import (
	"fmt"
	"github.com/ctld/ctld/internal/journal"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/ctld/ctld/internal/errdefs"
)

// mountSet is one of the fake's tables of ext4-on-NBD mounts: the block
// roots' and the persistent volumes' are both rootfs.Block in ctld, so
// they mount, unmount and check alike, each over its own dir, map, fault
// kind and call names. Its methods lock k.mu.
type mountSet struct {
	k      *Kernel
	kind   journal.Kind           // for Refuse and FailMake
	dir    string                 // mount points' parent
	mounts map[string]*blockMount // id → mount
	verb   string                 // call prefix: "<verb>mount", "<verb>unmount"
	// nbdOnly: a device not /dev/nbdN is invalid (the block roots), not
	// merely unconnected (the volumes), as each has always answered.
	nbdOnly bool
}

func (s *mountSet) target(id string) string { return filepath.Join(s.dir, id) }

// mount mounts a connected device at id's mount point.
func (s *mountSet) mount(id, device string) (string, error) {
	if err := validID(id); err != nil {
		return "", err
	}
	k := s.k
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.makeFails(s.kind, id); err != nil {
		return "", err
	}
	idx, err := strconv.Atoi(strings.TrimPrefix(device, "/dev/nbd"))
	if err != nil || !strings.HasPrefix(device, "/dev/nbd") {
		if s.nbdOnly {
			return "", errdefs.Errorf(errdefs.CodeInvalidArgument, "block device %q is not an NBD device", device)
		}
		return "", fmt.Errorf("mount %s: no such device (not connected)", device)
	}
	if k.nbd[idx] == "" {
		return "", fmt.Errorf("mount %s: no such device (not connected)", device)
	}
	target := s.target(id)
	if m, ok := s.mounts[id]; ok {
		if m.device != device {
			return "", errdefs.Errorf(errdefs.CodeConflict, "%s is already mounted from %s, want %s", target, m.device, device)
		}
		return target, nil
	}
	if err := os.MkdirAll(target, 0o700); err != nil {
		return "", err
	}
	s.mounts[id] = &blockMount{id: id, device: device, dev: fmt.Sprintf("43:%d", idx*32)}
	k.call("%smount %s %s", s.verb, id, device)
	return target, nil
}

// unmount unmounts id and removes its mount point.
func (s *mountSet) unmount(id string) error {
	if err := validID(id); err != nil {
		return err
	}
	k := s.k
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := s.mounts[id]; ok {
		if err := k.refused(s.kind, id); err != nil {
			return fmt.Errorf("unmount %s: %w", s.target(id), err)
		}
		delete(s.mounts, id)
		k.call("%sunmount %s", s.verb, id)
	}
	if err := os.Remove(s.target(id)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// list names the mount points and mounts.
func (s *mountSet) list() ([]string, error) {
	s.k.mu.Lock()
	defer s.k.mu.Unlock()
	return listIDs(s.dir, maps.Keys(s.mounts))
}

// mounted names the mounted ids.
func (s *mountSet) mounted() []string {
	s.k.mu.Lock()
	defer s.k.mu.Unlock()
	return slices.Sorted(maps.Keys(s.mounts))
}

// superblock is the mounted id's device.
func (s *mountSet) superblock(id string) (string, error) {
	s.k.mu.Lock()
	defer s.k.mu.Unlock()
	m, ok := s.mounts[id]
	if !ok {
		return "", fmt.Errorf("nothing mounted at %s", s.target(id))
	}
	return m.dev, nil
}

// checkGone: not mounted, mount point gone.
func (s *mountSet) checkGone(id string) (bool, string) {
	s.k.mu.Lock()
	defer s.k.mu.Unlock()
	if m, ok := s.mounts[id]; ok {
		return false, fmt.Sprintf("1 mount left at %s (ext4 from %s)", s.target(id), m.device)
	}
	if _, err := os.Lstat(s.target(id)); err == nil {
		return false, fmt.Sprintf("nothing mounted at %s but the mount point exists", s.target(id))
	}
	return true, fmt.Sprintf("nothing mounted at %s and it is gone", s.target(id))
}
