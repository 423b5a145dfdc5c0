package fakekernel

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/ctld/ctld/internal/journal"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/writer"
)

// Block mode: writer processes with their /dev/nbdX (node.BlockDevices,
// as writer.Supervisor), the devices' mounts (node.BlockMounts, as
// rootfs.Block) and the block store's templates (node.BlockTemplates).
// A killed writer leaves its device connected (the kernel waits for a
// reconnect), as a kill -9 of the real one does.

// TemplateSize is the device size of the fake block store's "busybox".
const TemplateSize = 64 << 20

type blockWriter struct {
	dir        string
	epoch      uint64
	index, pid int
	alive      bool
	size       int64
	device     string
	sandbox    string
	generation uint64
	volume     string // the fake volume a seal commits to ("" : sandbox's)
	spec       writer.Spec
}

type blockMount struct {
	id, device, dev string
}

// WritersDir is the writers' root (the Supervisor's Root).
func (k *Kernel) WritersDir() string { return filepath.Join(k.root, "writers") }

// BlockRootDir holds the block roots' mount points.
func (k *Kernel) BlockRootDir() string { return filepath.Join(k.root, "blockroot") }

// KillWriter kills the writer of dir (kill -9): its device stays
// connected, its state stays.
func (k *Kernel) KillWriter(dir string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if w, ok := k.writers[dir]; ok {
		w.alive = false
	}
	k.call("kill-writer %s", filepath.Base(dir))
}

// WriterSpec is the spec the last writer of dir was started with.
func (k *Kernel) WriterSpec(dir string) (writer.Spec, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	w, ok := k.writers[dir]
	if !ok {
		return writer.Spec{}, false
	}
	return w.spec, true
}

// Blocks is the fake's node.BlockDevices.
func (k *Kernel) Blocks() *Blocks { return (*Blocks)(k) }

// BlockMounts is the fake's node.BlockMounts.
func (k *Kernel) BlockMounts() *BlockMounts { return (*BlockMounts)(k) }

// Templates is the fake's node.BlockTemplates: "busybox" of TemplateSize.
func (k *Kernel) Templates() *Templates { return (*Templates)(k) }

// Blocks fakes writer.Supervisor.
type Blocks Kernel

func (b *Blocks) k() *Kernel { return (*Kernel)(b) }

func (b *Blocks) inRoot(dir string) error {
	// A persistent volume's writer: <writers>/vol/<container>/<volume>.
	if gen := filepath.Dir(dir); filepath.Dir(gen) == filepath.Join(b.k().WritersDir(), "vol") && validID(filepath.Base(gen)) == nil && validID(filepath.Base(dir)) == nil {
		return nil
	}
	if filepath.Dir(dir) != b.k().WritersDir() || validID(filepath.Base(dir)) != nil {
		return fmt.Errorf("%w: dir %q is not under the writers' root %q", writer.ErrInvalidSpec, dir, b.k().WritersDir())
	}
	return nil
}

// Start attaches the lowest free device; a live writer for the dir is
// writer.ErrBusy.
func (b *Blocks) Start(ctx context.Context, spec writer.Spec) (writer.State, error) {
	if err := b.inRoot(spec.Dir); err != nil {
		return writer.State{}, err
	}
	k := b.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.makeFails(journal.KindWriter, filepath.Base(spec.Dir)); err != nil {
		return writer.State{}, err
	}
	old, ok := k.writers[spec.Dir]
	if ok && old.alive {
		return writer.State{}, fmt.Errorf("start writer %s: %w (pid %d)", spec.Dir, writer.ErrBusy, old.pid)
	}
	if spec.Epoch == 0 || spec.Reattach && spec.Index < 0 {
		return writer.State{}, fmt.Errorf("%w: epoch %d, index %d", writer.ErrInvalidSpec, spec.Epoch, spec.Index)
	}
	if ok && spec.Epoch <= old.epoch {
		return writer.State{}, fmt.Errorf("start writer %s: %w: dir has epoch %d, spec %d", spec.Dir, writer.ErrStaleEpoch, old.epoch, spec.Epoch)
	}
	// A dead writer's device still connected is re-attached (the real
	// writer's NBD RECONFIGURE); a Reattach spec takes only that one.
	stale := ok && k.nbd[old.index] == spec.Dir
	if spec.Reattach && (!stale || old.index != spec.Index) {
		return writer.State{}, fmt.Errorf("start writer %s: %w (nbd%d)", spec.Dir, writer.ErrNoReattach, spec.Index)
	}
	if err := os.MkdirAll(spec.Dir, 0o700); err != nil {
		return writer.State{}, err
	}
	// As the Supervisor does: the orphan sweep reads it.
	if b, err := json.Marshal(spec); err != nil {
		return writer.State{}, err
	} else if err := os.WriteFile(filepath.Join(spec.Dir, writer.SpecName), b, 0o600); err != nil {
		return writer.State{}, err
	}
	idx := 0
	for k.nbd[idx] != "" {
		idx++
	}
	if stale {
		idx = old.index
	}
	w := &blockWriter{dir: spec.Dir, epoch: spec.Epoch, index: idx, pid: int(k.next), alive: true, size: TemplateSize,
		device: "/dev/nbd" + strconv.Itoa(idx), sandbox: spec.Sandbox, generation: spec.Generation, spec: spec}
	if spec.Volume.Kind == blockstore.KindVolume {
		w.volume = pvolKey(spec.Volume.ID)
	}
	k.next++
	k.writers[spec.Dir] = w
	k.nbd[idx] = spec.Dir
	k.call("writer start %s epoch %d nbd%d", filepath.Base(spec.Dir), spec.Epoch, idx)
	return w.state(), nil
}

func (w *blockWriter) state() writer.State {
	return writer.State{PID: w.pid, Epoch: w.epoch, Index: w.index, Device: w.device, Size: w.size}
}

// Stop ends the dir's writer and disconnects its device; none is success.
func (b *Blocks) Stop(ctx context.Context, dir string) error {
	if err := b.inRoot(dir); err != nil {
		return err
	}
	k := b.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	w, ok := k.writers[dir]
	if !ok {
		return nil
	}
	if err := k.refused(journal.KindWriter, filepath.Base(dir)); err != nil {
		return fmt.Errorf("stop writer %s: %w", dir, err)
	}
	if k.nbd[w.index] == dir {
		delete(k.nbd, w.index)
	}
	delete(k.writers, dir)
	k.call("writer stop %s", filepath.Base(dir))
	return nil
}

// Check is the live writer's state, else writer.ErrNotRunning.
func (b *Blocks) Check(ctx context.Context, dir string) (writer.State, error) {
	if err := b.inRoot(dir); err != nil {
		return writer.State{}, err
	}
	k := b.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	w, ok := k.writers[dir]
	if !ok || !w.alive {
		return writer.State{}, fmt.Errorf("%w: %s", writer.ErrNotRunning, dir)
	}
	return w.state(), nil
}

// CheckGone: no writer of dir, and device index not connected.
func (b *Blocks) CheckGone(ctx context.Context, dir string, index int) (bool, string) {
	if err := b.inRoot(dir); err != nil {
		return false, err.Error()
	}
	k := b.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if w, ok := k.writers[dir]; ok && w.alive {
		return false, fmt.Sprintf("writer pid %d (epoch %d) still runs for %s", w.pid, w.epoch, dir)
	}
	if index >= 0 && k.nbd[index] != "" {
		return false, fmt.Sprintf("nbd%d not quiescent: connected (writer dir %s)", index, k.nbd[index])
	}
	if index < 0 {
		return true, "no writer; no device attached"
	}
	return true, fmt.Sprintf("no writer; nbd%d quiescent", index)
}

// List returns the dirs with a writer (alive or killed) directly under
// the writers' root, sorted (as writer.Supervisor.List: a persistent
// volume's writer, deeper, is its generation's volumes entry's).
func (b *Blocks) List(ctx context.Context) ([]string, error) {
	k := b.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for dir := range k.writers {
		if filepath.Dir(dir) == k.WritersDir() {
			out = append(out, dir)
		}
	}
	slices.Sort(out)
	return out, nil
}

// BlockMounts fakes rootfs.Block.
type BlockMounts Kernel

func (m *BlockMounts) k() *Kernel { return (*Kernel)(m) }

// set is the block roots' mount table.
func (m *BlockMounts) set() *mountSet {
	k := m.k()
	return &mountSet{k: k, kind: journal.KindBlockMount, dir: k.BlockRootDir(), mounts: k.bmounts, verb: "block", nbdOnly: true}
}

// Mount mounts a connected device at id's mount point.
func (m *BlockMounts) Mount(ctx context.Context, id, device string) (string, error) {
	return m.set().mount(id, device)
}

// Unmount unmounts id's root and removes its mount point.
func (m *BlockMounts) Unmount(ctx context.Context, id string) error { return m.set().unmount(id) }

// List names the mount points and mounts.
func (m *BlockMounts) List(ctx context.Context) ([]string, error) {
	ids, err := m.set().list()
	if err != nil {
		return nil, fmt.Errorf("list block mount dir: %w", err)
	}
	return ids, nil
}

// Mounted names the mounted roots.
func (m *BlockMounts) Mounted(ctx context.Context) ([]string, error) { return m.set().mounted(), nil }

// Superblock is the mounted root's device.
func (m *BlockMounts) Superblock(id string) (string, error) { return m.set().superblock(id) }

// CheckGone: not mounted, mount point gone.
func (m *BlockMounts) CheckGone(ctx context.Context, id, dev string) (bool, string) {
	return m.set().checkGone(id)
}

// Templates fakes the block store's templates.
type Templates Kernel

// Template knows "busybox" only.
func (t *Templates) Template(ctx context.Context, name string) (blockstore.GenRef, int64, error) {
	if name != "busybox" {
		return blockstore.GenRef{}, 0, errdefs.Errorf(errdefs.CodeNotFound, "block template %q not found in this node's block store", name)
	}
	return blockstore.GenRef{Volume: blockstore.Template(name)}, TemplateSize, nil
}

// renderBlockLocked adds the block-mode objects and files to String.
func (k *Kernel) renderBlockLocked(add func(string, ...any)) {
	for _, w := range k.writers {
		state := "alive"
		if !w.alive {
			state = "killed"
		}
		add("writer %s epoch %d nbd%d %s", filepath.Base(w.dir), w.epoch, w.index, state)
	}
	for idx, dir := range k.nbd {
		add("nbd%d connected for %s", idx, filepath.Base(dir))
	}
	for _, bm := range k.bmounts {
		add("blockmount %s from %s", bm.id, bm.device)
	}
	for _, vm := range k.vmounts {
		add("volume mount %s from %s", vm.id, vm.device)
	}
}
