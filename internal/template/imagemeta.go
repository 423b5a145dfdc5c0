package template

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/blockstore"
)

// Meta is what a template records of where it came from and how its image
// wants to be run; stored sealed beside the template (blockstore.PutMeta).
type Meta struct {
	Source      string      `json:"source"` // "registry"
	Ref         string      `json:"ref"`
	Digest      string      `json:"digest"` // the image manifest's
	IndexDigest string      `json:"index_digest,omitempty"`
	Platform    string      `json:"platform,omitempty"`
	Config      ImageConfig `json:"config"`
	// Layers are the image's layer digests: what the layer cache keeps
	// for it (Prune).
	Layers []string `json:"layers,omitempty"`
	// Image is the stored image of these layers this template is a fork
	// of (base.go); empty for one that has its own.
	Image string `json:"image,omitempty"`
}

// ImageConfig is the part of an image's config a claim of the template
// takes as its defaults.
type ImageConfig struct {
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	// User as the image says it ("app", "1000:1000", "app:staff"), and
	// resolved at import in the image's /etc/passwd and /etc/group.
	User string `json:"user,omitempty"`
	UID  uint32 `json:"uid"`
	GID  uint32 `json:"gid"`
}

// ReadMeta returns template name's metadata; ok is false for a template
// imported without any (a tree, an archive).
func ReadMeta(ctx context.Context, repo *blockstore.Repo, name string) (Meta, bool, error) {
	b, err := repo.Meta(ctx, blockstore.Template(name))
	if errors.Is(err, blockstore.ErrNotFound) {
		return Meta{}, false, nil
	}
	if err != nil {
		return Meta{}, false, fmt.Errorf("read template %s: %w", name, err)
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return Meta{}, false, fmt.Errorf("read template %s metadata: %w: %w", name, blockstore.ErrCorrupt, err)
	}
	return m, true, nil
}

// ImportImage pulls ref (PullImage: through the layer cache), builds it
// into an ext4 image and stores it as template name with its Meta: the
// metadata is written before the manifest, so a template that exists has
// it. The image is stored once per image key (base.go): a template whose
// layers, size and label an earlier import had is a fork of that image,
// made without downloading, unpacking or building anything (with
// o.Trees, the tree is still unpacked; its image is not built again). An
// image refused for its content leaves nothing, neither in the store nor
// in the cache; a transport failure keeps the layers it finished in the
// cache for the next try.
func ImportImage(ctx context.Context, repo *blockstore.Repo, name, ref string, po PullOptions, o ImageOptions, tmpDir string) (_ *blockstore.Manifest, res ImageResult, _ Meta, err error) {
	vol := blockstore.Template(name)
	if err := vol.Check(); err != nil {
		return nil, res, Meta{}, fmt.Errorf("import template %q: %w", name, err)
	}
	if gens, err := repo.Generations(ctx, vol); err != nil {
		return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	} else if len(gens) > 0 {
		return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, ErrTemplateExists)
	}
	if _, err := repo.Meta(ctx, vol); err == nil {
		return nil, res, Meta{}, fmt.Errorf("import template %s: an unfinished import left its metadata (`template rm %s` removes it): %w", name, name, ErrTemplateExists)
	}
	tree, err := o.Trees.begin(name) // before the pull: refused early
	if err != nil {
		return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	}
	o.tree = tree
	defer o.Trees.drop(tree) // gone once published
	// The cache's lock, shared, from before the pull looks for layers
	// until the template records them: Prune waits for it.
	unlock, err := lockCache(ctx, po.CacheDir, unix.LOCK_SH)
	if err != nil {
		return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	}
	defer unlock()
	r, err := resolveImage(ctx, ref, po)
	if err != nil {
		return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(r.rawConfig))
	if err != nil {
		return nil, res, Meta{}, fmt.Errorf("import template %s: image config: %w: %w", name, ErrBadSource, err)
	}
	meta := Meta{Source: "registry", Ref: ref, Digest: r.p.Digest.String(), Platform: r.p.Platform.String(),
		Config: ImageConfig{Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd, Env: cf.Config.Env, WorkingDir: cf.Config.WorkingDir, User: cf.Config.User}}
	for _, l := range r.m.Layers {
		meta.Layers = append(meta.Layers, l.Digest.String())
	}
	if r.p.IndexDigest.Hex != "" {
		meta.IndexDigest = r.p.IndexDigest.String()
	}
	if wd := meta.Config.WorkingDir; wd != "" && (!path.IsAbs(wd) || path.Clean(wd) != wd) {
		return nil, res, Meta{}, fmt.Errorf("import template %s: working dir %q is not an absolute clean path: %w", name, wd, ErrBadSource)
	}
	key := imageKey(r.m.Layers, o)
	bm, haveBase, stored, err := readBase(ctx, repo, key)
	if err != nil {
		return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	}
	cloned := false
	if haveBase && stored && o.tree != "" && (meta.Config.User == "" || bm.HasIDs) {
		// The tree too: a hard-linked copy of another fork's, if any.
		src, err := o.Trees.sharedTree(ctx, repo, baseVolume(key).ID)
		if err != nil {
			return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
		}
		if src != "" {
			if cerr := cloneTree(ctx, src, o.tree); cerr == nil {
				cloned = true
			} else if err := resetDir(o.tree); err != nil { // unpacked instead
				return nil, res, Meta{}, fmt.Errorf("import template %s: %w (after %w)", name, err, cerr)
			}
		}
	}
	if haveBase && stored && (o.tree == "" || cloned) && (meta.Config.User == "" || bm.HasIDs) {
		// The image of these layers is stored: nothing to pull or build.
		meta.Config.UID, meta.Config.GID, err = resolveUser(bm.Passwd, bm.Group, meta.Config.User)
		if err != nil {
			return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
		}
		r.reportCached()
		meta.Image = baseVolume(key).ID
		res = ImageResult{Entries: bm.Entries, Bytes: bm.Bytes, Skipped: bm.Skipped, Base: meta.Image, Reused: true}
		m, err := forkBase(ctx, repo, vol, key, meta)
		if err != nil {
			return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
		}
		if o.Progress != nil {
			o.Progress(Progress{Phase: "stored", Entries: 0, Bytes: int64(m.DeviceSize)})
		}
		return m, res, meta, o.Trees.publishImported(o.tree, name)
	}
	p, err := r.pull(ctx)
	if err != nil {
		return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	}
	ok := false
	defer func() {
		if !ok && (errors.Is(err, ErrBadSource) || errors.Is(err, ErrUnsafePath) || errors.Is(err, ErrImageTooSmall)) {
			p.Discard()
		}
	}()
	var ids struct{ passwd, group []byte }
	o.Inspect = func(root *os.Root) error {
		var rerr error
		if ids.passwd, ids.group, rerr = readIDFiles(root); rerr != nil {
			return rerr
		}
		meta.Config.UID, meta.Config.GID, rerr = resolveUser(ids.passwd, ids.group, meta.Config.User)
		return rerr
	}
	// Stored already (only the tree or the user was wanted): no image.
	o.noImage = haveBase && stored
	dir, err := os.MkdirTemp(tmpDir, "template-import-")
	if err != nil {
		return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	}
	defer os.RemoveAll(dir)
	img := dir + "/root.ext4"
	o.transient = true
	res, err = BuildImage(ctx, Source{Kind: KindImage, Path: ref, Image: p.Image}, img, o)
	if err != nil {
		return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	}
	based := o.noImage
	res.Reused = o.noImage
	if !based {
		bm = baseMeta{Source: sourceBase, Key: key, Layers: meta.Layers, Entries: res.Entries, Bytes: res.Bytes, Skipped: keptSkipped(res.Skipped)}
		if len(ids.passwd)+len(ids.group) <= maxBaseIDs {
			bm.Passwd, bm.Group, bm.HasIDs = ids.passwd, ids.group, true
		}
		// The template's metadata (its data key and meta object, two
		// durable writes) is written while the base uploads, not after:
		// the fork then only adds its manifest.
		fm := meta
		fm.Image = baseVolume(key).ID
		metaPut := make(chan error, 1)
		go func() { metaPut <- putTemplateMeta(ctx, repo, vol, fm) }()
		based, err = storeBase(ctx, repo, key, img, bm, o.Progress)
		merr := <-metaPut
		if merr == nil && (err != nil || !based) {
			// Not a fork after all: the metadata was ours (create-once).
			// Its data key stays, as a failed fork's does: unused, reused
			// by the next import of the name, removed by `template rm`.
			if derr := repo.DeleteMeta(context.WithoutCancel(ctx), vol); derr != nil {
				return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, errors.Join(err, derr))
			}
		}
		if err != nil {
			return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
		}
		if based {
			if merr != nil {
				return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, merr)
			}
			meta = fm
			res.Base = meta.Image
			m, err := forkMeta(ctx, repo, vol, key)
			if err != nil {
				return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
			}
			ok = true
			return m, res, meta, o.Trees.publishImported(o.tree, name)
		}
	}
	var m *blockstore.Manifest
	if based {
		meta.Image = baseVolume(key).ID
		res.Base = meta.Image
		if m, err = forkBase(ctx, repo, vol, key, meta); err != nil {
			return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
		}
	} else if m, err = importOwn(ctx, repo, name, img, meta, o.Progress); err != nil {
		return nil, res, Meta{}, err
	}
	ok = true
	return m, res, meta, o.Trees.publishImported(o.tree, name)
}

// importOwn stores the image file img as template name with meta, not as
// a fork of a base (the base's name is another template's).
func importOwn(ctx context.Context, repo *blockstore.Repo, name, img string, meta Meta, progress func(Progress)) (*blockstore.Manifest, error) {
	vol := blockstore.Template(name)
	b, err := json.Marshal(meta)
	if err != nil {
		return nil, fmt.Errorf("import template %s: %w", name, err)
	}
	if err = repo.PutMeta(ctx, vol, b); err != nil {
		if errors.Is(err, blockstore.ErrExists) {
			err = fmt.Errorf("%w: %w", ErrTemplateExists, err)
		}
		return nil, fmt.Errorf("import template %s: %w", name, err)
	}
	m, err := importChecked(ctx, repo, name, img, progress)
	if err != nil {
		// Ours (PutMeta was create-once), unless another import of the
		// name won the manifest: then the template is theirs, with it.
		if !errors.Is(err, ErrTemplateExists) {
			if derr := repo.DeleteMeta(context.WithoutCancel(ctx), vol); derr != nil {
				err = errors.Join(err, derr)
			}
		}
		return nil, err
	}
	return m, nil
}

// maxIDFile bounds what is read of the image's /etc/passwd and /etc/group.
const maxIDFile = 1 << 20

// resolveUser turns an image config's user (NAME, UID, NAME:GROUP,
// UID:GID, ...) into ids, looked up in the tree's /etc/passwd and
// /etc/group as Docker does: a numeric user missing from passwd is that
// uid with gid 0; a name that is not there is an error.
func resolveUser(passwdFile, groupFile []byte, user string) (uid, gid uint32, err error) {
	if user == "" {
		return 0, 0, nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	if u == "" || (hasGroup && g == "") {
		return 0, 0, fmt.Errorf("image user %q: want USER[:GROUP]: %w", user, ErrBadSource)
	}
	passwd, err := idLines(passwdFile, "etc/passwd")
	if err != nil {
		return 0, 0, err
	}
	if n, err := strconv.ParseUint(u, 10, 32); err == nil {
		uid = uint32(n)
		for _, f := range passwd {
			if f[2] == u {
				if n, err := strconv.ParseUint(f[3], 10, 32); err == nil {
					gid = uint32(n)
				}
				break
			}
		}
	} else {
		found := false
		for _, f := range passwd {
			if f[0] == u {
				nu, err1 := strconv.ParseUint(f[2], 10, 32)
				ng, err2 := strconv.ParseUint(f[3], 10, 32)
				if err1 != nil || err2 != nil {
					return 0, 0, fmt.Errorf("image user %q: bad /etc/passwd line: %w", u, ErrBadSource)
				}
				uid, gid, found = uint32(nu), uint32(ng), true
				break
			}
		}
		if !found {
			return 0, 0, fmt.Errorf("image user %q is not in the image's /etc/passwd: %w", u, ErrBadSource)
		}
	}
	if !hasGroup {
		return uid, gid, nil
	}
	if n, err := strconv.ParseUint(g, 10, 32); err == nil {
		return uid, uint32(n), nil
	}
	groups, err := idLines(groupFile, "etc/group")
	if err != nil {
		return 0, 0, err
	}
	for _, f := range groups {
		if f[0] == g {
			n, err := strconv.ParseUint(f[2], 10, 32)
			if err != nil {
				return 0, 0, fmt.Errorf("image group %q: bad /etc/group line: %w", g, ErrBadSource)
			}
			return uid, uint32(n), nil
		}
	}
	return 0, 0, fmt.Errorf("image group %q is not in the image's /etc/group: %w", g, ErrBadSource)
}

// readIDFiles reads the tree's /etc/passwd and /etc/group (at most
// maxIDFile bytes each); a missing file is empty.
func readIDFiles(root *os.Root) (passwd, group []byte, err error) {
	if passwd, err = idFile(root, "etc/passwd"); err != nil {
		return nil, nil, err
	}
	if group, err = idFile(root, "etc/group"); err != nil {
		return nil, nil, err
	}
	return passwd, group, nil
}

func idFile(root *os.Root, name string) ([]byte, error) {
	f, err := root.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, escapeErr(name, fmt.Errorf("open image's /%s: %w", name, err))
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxIDFile))
	if err != nil {
		return nil, fmt.Errorf("read image's /%s: %w: %w", name, ErrBadSource, err)
	}
	return b, nil
}

// idLines reads a passwd-style file as lines of at least four
// colon-separated fields (group lines are padded).
func idLines(b []byte, name string) ([][]string, error) {
	var out [][]string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fs := strings.Split(line, ":")
		for len(fs) < 4 {
			fs = append(fs, "")
		}
		out = append(out, fs)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read image's /%s: %w: %w", name, ErrBadSource, err)
	}
	return out, nil
}
