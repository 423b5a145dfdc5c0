package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"github.com/ctld/ctld/internal/basecache"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/storecfg"
	"github.com/ctld/ctld/internal/blockvol"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/node"
	"github.com/ctld/ctld/internal/node/blockroot"
	"github.com/ctld/ctld/internal/node/pvolume"
	"github.com/ctld/ctld/internal/node/writers"
	"github.com/ctld/ctld/internal/rootfs"
	"github.com/ctld/ctld/internal/template"
	"github.com/ctld/ctld/internal/writer"
)

// blockOpts configure block-mode generations (rootfs.mode = block).
type blockOpts struct {
	store        string // block store dir or s3://bucket/prefix ("": <state>/blockstore)
	s3           storecfg.Config
	getenv       func(string) string // the S3 credentials' environment (nil: os.Getenv)
	keyFile      string              // node key file ("": <state>/blockstore.key)
	keyID        string
	deadConn     time.Duration
	reqTimeout   time.Duration
	baseCache    string // the node's base cache dir, "off" for none
	cgroup       string // the writers' cgroup, under --cgroup-root
	busyboxBytes int64  // device size of the imported busybox template
}

func (b *blockOpts) flags(f *pflag.FlagSet) {
	f.StringVar(&b.store, "block-store", "", "block store of block-mode RootFS: a directory or s3://BUCKET[/PREFIX] (default <state-dir>/blockstore)")
	b.s3.Flags(f)
	f.StringVar(&b.keyFile, "node-key", "", "node key file of the block store (64 hex digits; made 0600 on first start if missing; default <state-dir>/blockstore.key)")
	f.StringVar(&b.keyID, "node-key-id", "node", "node key ID of the block store")
	f.DurationVar(&b.deadConn, "writer-dead-conn-timeout", 2*time.Minute, "how long the kernel holds a block device's I/O for a reconnect after its writer's socket died")
	f.DurationVar(&b.reqTimeout, "writer-request-timeout", writer.DefaultRequestTimeout, "the kernel's per-request timeout of a block device (whole seconds); a write in flight when its writer died is retried on the restarted writer after it")
	f.StringVar(&b.baseCache, "block-base-cache", "", "the node's cache of template chunks, decrypted and decoded, shared by all writers (cleared at each boot; \"off\" for none; default <state-dir>/basecache)")
	f.StringVar(&b.cgroup, "writers-cgroup", "ctld-writers.slice", "ctld-owned cgroup (under --cgroup-root; not a lease) the block-mode writer processes run in")
	f.Int64Var(&b.busyboxBytes, "busybox-block-bytes", 64<<20, "device size of the busybox template imported into the block store (a multiple of 64 KiB)")
}

// minDeadConn is the least --writer-dead-conn-timeout.
const minDeadConn = 10 * time.Second

func (b *blockOpts) check() error {
	// A dead writer is noticed within a second and restarted in seconds:
	// a shorter timeout fails the guest's I/O first.
	if b.deadConn < minDeadConn {
		return fmt.Errorf("--writer-dead-conn-timeout must be at least %v (a dead writer's restart must fit in it), got %v", minDeadConn, b.deadConn)
	}
	if b.reqTimeout < time.Second || b.reqTimeout%time.Second != 0 {
		return fmt.Errorf("--writer-request-timeout must be whole seconds, at least 1s, got %v", b.reqTimeout)
	}
	if b.deadConn%time.Second != 0 {
		return fmt.Errorf("--writer-dead-conn-timeout must be whole seconds, got %v", b.deadConn)
	}
	if b.baseCache != "" && b.baseCache != "off" && !filepath.IsAbs(b.baseCache) {
		return fmt.Errorf("--block-base-cache must be an absolute path or \"off\", got %q", b.baseCache)
	}
	if b.busyboxBytes <= 0 || b.busyboxBytes%blockstore.DefaultChunkSize != 0 {
		return fmt.Errorf("--busybox-block-bytes must be a positive multiple of %d, got %d", blockstore.DefaultChunkSize, b.busyboxBytes)
	}
	if b.cgroup == "" || filepath.IsAbs(b.cgroup) || filepath.Clean(b.cgroup) != b.cgroup || b.cgroup == ".." || len(b.cgroup) > 2 && b.cgroup[:3] == "../" {
		return fmt.Errorf("--writers-cgroup must be a relative cgroup path under --cgroup-root, got %q", b.cgroup)
	}
	return nil
}

// probeStore opens an S3 block store once at start, before ctld contends
// for the primary lock: bad settings or credentials stop it there, naming
// the cause, instead of a standby that fails at its takeover.
func (b blockOpts) probeStore(ctx context.Context, stateDir string) error {
	b = b.withDefaults(stateDir)
	sc := b.s3
	sc.Location = b.store
	if !sc.IsS3() {
		return nil // a directory store is made at takeover
	}
	getenv := b.getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if _, err := sc.Open(ctx, false, getenv); err != nil {
		return fmt.Errorf("block mode: %w", err)
	}
	return nil
}

func (b blockOpts) withDefaults(stateDir string) blockOpts {
	if b.store == "" {
		b.store = filepath.Join(stateDir, "blockstore")
	}
	if b.keyFile == "" {
		b.keyFile = filepath.Join(stateDir, "blockstore.key")
	}
	switch b.baseCache {
	case "":
		b.baseCache = filepath.Join(stateDir, "basecache")
	case "off":
		b.baseCache = ""
	}
	return b
}

// blockTemplates are the templates of the node's block store.
type blockTemplates struct{ repo *blockstore.Repo }

func (t blockTemplates) Template(ctx context.Context, name string) (blockstore.GenRef, int64, error) {
	ref := blockstore.GenRef{Volume: blockstore.Template(name)}
	if err := ref.Volume.Check(); err != nil {
		return ref, 0, errdefs.Errorf(errdefs.CodeInvalidArgument, "block template %q: %v", name, err)
	}
	m, err := t.repo.Manifest(ctx, ref)
	if errors.Is(err, blockstore.ErrNotFound) {
		return ref, 0, errdefs.Errorf(errdefs.CodeNotFound, "block template %q not found in this node's block store (ctl-manager template import)", name)
	}
	if err != nil {
		return ref, 0, fmt.Errorf("block template %s: %w", name, err)
	}
	return ref, int64(m.DeviceSize), nil
}

// buildBlock wires block mode: the store and its node key, the busybox
// template imported once, the writers' supervisor and the roots' mounts.
func buildBlock(ctx context.Context, stateDir, cgroupRoot, busyboxDir string, o blockOpts, log *slog.Logger) (node.BlockConfig, node.Deps, error) {
	o = o.withDefaults(stateDir)
	var d node.Deps
	nk, err := blockstore.LoadOrCreateNodeKeyFile(o.keyFile, o.keyID)
	if err != nil {
		return node.BlockConfig{}, d, err
	}
	getenv := o.getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	sc := o.s3
	sc.Location = o.store
	// An S3 store is probed here: a bad setting stops ctld at start.
	st, err := sc.Open(ctx, true, getenv)
	if err != nil {
		return node.BlockConfig{}, d, err
	}
	repo, err := blockstore.New(st, nk, blockstore.Options{Compression: blockstore.CompressS2})
	if err != nil {
		return node.BlockConfig{}, d, err
	}
	tpl := blockTemplates{repo}
	importBusybox(ctx, repo, tpl, busyboxDir, stateDir, o.busyboxBytes, log)
	if o.baseCache != "" {
		pruneBaseCache(ctx, o.baseCache, repo, log)
	}
	exe, err := os.Executable()
	if err != nil {
		return node.BlockConfig{}, d, fmt.Errorf("find own binary for the writers: %w", err)
	}
	writersDir := filepath.Join(stateDir, "writers")
	if err := os.MkdirAll(writersDir, 0o700); err != nil {
		return node.BlockConfig{}, d, fmt.Errorf("make writers dir: %w", err)
	}
	// The writers open the same store: credentials from the environment
	// reach them in theirs (readable by root only), never in argv or spec.
	var env []string
	if sc.IsS3() && sc.CredentialsFile == "" {
		env = storecfg.Env(getenv)
	}
	sup := &writer.Supervisor{Binary: exe, Root: writersDir, Cgroup: filepath.Join(cgroupRoot, o.cgroup), Env: env, Logger: log}
	mounts := &rootfs.Block{Dir: filepath.Join(stateDir, "blockroot"), Logger: log}
	d.Writers = writers.Deps{Devices: sup, Sealer: blockvol.Sealer{Supervisor: sup}}
	d.Block = blockroot.Deps{Mounts: mounts, Templates: tpl, Volumes: blockvol.Volumes{Repo: repo}, Freezer: mounts}
	d.ImageDefaults = tpl // claims of either root mode take their template image's defaults
	// Persistent volumes: mounted beside the roots, in a dir of their own
	// (keyed by volume id), so neither sweep takes the other's mounts.
	vmounts := &rootfs.Block{Dir: filepath.Join(stateDir, "volmounts"), Logger: log}
	d.Volumes = pvolume.Deps{Store: blockvol.Volumes{Repo: repo, Kind: blockstore.KindVolume}, Mounts: vmounts, Freezer: vmounts}
	cfg := node.BlockConfig{WritersDir: writersDir, Store: sc, NodeKeyFile: o.keyFile, NodeKeyID: o.keyID, BaseCache: o.baseCache, DeadConnTimeout: o.deadConn, RequestTimeout: o.reqTimeout}
	return cfg, d, nil
}

// pruneBaseCache, at a takeover, clears earlier boots' base caches and
// removes this boot's caches of template generations the store no longer
// has (a `template rm`): the cache would otherwise keep them until the
// next boot. A failure costs disk space, not correctness: it is logged.
func pruneBaseCache(ctx context.Context, dir string, repo *blockstore.Repo, log *slog.Logger) {
	c, err := basecache.Open(dir, basecache.Options{Logger: log})
	if err != nil {
		log.Warn("base cache not pruned", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	n, err := c.Prune(ctx, func(ctx context.Context, ref blockstore.GenRef) (bool, error) {
		_, err := repo.Manifest(ctx, ref)
		if errors.Is(err, blockstore.ErrNotFound) {
			return false, nil
		}
		return true, err
	})
	if err != nil {
		log.Warn("base cache prune", "removed", n, "err", err)
	} else if n > 0 {
		log.Info("base cache pruned", "removed", n)
	}
}

// importBusybox imports the busybox template dir as the block store's
// template "busybox", once: skipped when the store has it. A failure is
// logged; block claims of it are then refused as not found.
func importBusybox(ctx context.Context, repo *blockstore.Repo, tpl blockTemplates, dir, tmp string, size int64, log *slog.Logger) {
	if _, err := os.Stat(filepath.Join(dir, "bin", "sh")); err != nil {
		return // no busybox template dir (--busybox "")
	}
	if _, _, err := tpl.Template(ctx, "busybox"); err == nil {
		return
	}
	t0 := time.Now()
	_, res, err := template.ImportSource(ctx, repo, "busybox", template.Source{Kind: template.KindDir, Path: dir}, template.ImageOptions{Size: size}, tmp)
	if errors.Is(err, template.ErrTemplateExists) {
		return
	}
	if err != nil {
		log.Warn("busybox block template unavailable", "err", err)
		return
	}
	log.Info("imported the busybox template into the block store", "entries", res.Entries, "device_bytes", size, "ms", time.Since(t0).Milliseconds())
}
