package template

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

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
// it. An image refused for its content leaves nothing, neither in the
// store nor in the cache; a transport failure keeps the layers it
// finished in the cache for the next try.
func ImportImage(ctx context.Context, repo *blockstore.Repo, name, ref string, po PullOptions, o ImageOptions, tmpDir string) (*blockstore.Manifest, ImageResult, Meta, error) {
	vol := blockstore.Template(name)
	if err := vol.Check(); err != nil {
		return nil, ImageResult{}, Meta{}, fmt.Errorf("import template %q: %w", name, err)
	}
	if gens, err := repo.Generations(ctx, vol); err != nil {
		return nil, ImageResult{}, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	} else if len(gens) > 0 {
		return nil, ImageResult{}, Meta{}, fmt.Errorf("import template %s: %w", name, ErrTemplateExists)
	}
	if _, err := repo.Meta(ctx, vol); err == nil {
		return nil, ImageResult{}, Meta{}, fmt.Errorf("import template %s: an unfinished import left its metadata (`template rm %s` removes it): %w", name, name, ErrTemplateExists)
	}
	tree, err := o.Trees.begin(name) // before the pull: refused early
	if err != nil {
		return nil, ImageResult{}, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	}
	o.tree = tree
	defer o.Trees.drop(tree) // gone once published
	// The cache's lock, shared, from before the pull looks for layers
	// until the template records them: Prune waits for it.
	unlock, err := lockCache(ctx, po.CacheDir, unix.LOCK_SH)
	if err != nil {
		return nil, ImageResult{}, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	}
	defer unlock()
	p, err := PullImage(ctx, ref, po)
	if err != nil {
		return nil, ImageResult{}, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	}
	ok := false
	defer func() {
		if !ok && (errors.Is(err, ErrBadSource) || errors.Is(err, ErrUnsafePath) || errors.Is(err, ErrImageTooSmall)) {
			p.Discard()
		}
	}()
	cf, err := p.Image.ConfigFile()
	if err != nil {
		err = fmt.Errorf("import template %s: image config: %w: %w", name, ErrBadSource, err)
		return nil, ImageResult{}, Meta{}, err
	}
	meta := Meta{Source: "registry", Ref: ref, Digest: p.Digest.String(), Platform: p.Platform.String(),
		Config: ImageConfig{Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd, Env: cf.Config.Env, WorkingDir: cf.Config.WorkingDir, User: cf.Config.User}}
	im, err := p.Image.Manifest()
	if err != nil {
		err = fmt.Errorf("import template %s: image manifest: %w: %w", name, ErrBadSource, err)
		return nil, ImageResult{}, Meta{}, err
	}
	for _, l := range im.Layers {
		meta.Layers = append(meta.Layers, l.Digest.String())
	}
	if p.IndexDigest.Hex != "" {
		meta.IndexDigest = p.IndexDigest.String()
	}
	if wd := meta.Config.WorkingDir; wd != "" && (!path.IsAbs(wd) || path.Clean(wd) != wd) {
		err = fmt.Errorf("import template %s: working dir %q is not an absolute clean path: %w", name, wd, ErrBadSource)
		return nil, ImageResult{}, Meta{}, err
	}
	o.Inspect = func(root *os.Root) error {
		uid, gid, rerr := resolveUser(root, meta.Config.User)
		meta.Config.UID, meta.Config.GID = uid, gid
		return rerr
	}
	dir, err := os.MkdirTemp(tmpDir, "template-import-")
	if err != nil {
		return nil, ImageResult{}, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	}
	defer os.RemoveAll(dir)
	img := dir + "/root.ext4"
	res, err := BuildImage(ctx, Source{Kind: KindImage, Path: ref, Image: p.Image}, img, o)
	if err != nil {
		return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	}
	b, err := json.Marshal(meta)
	if err != nil {
		return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	}
	if err = repo.PutMeta(ctx, vol, b); err != nil {
		if errors.Is(err, blockstore.ErrExists) {
			err = fmt.Errorf("%w: %w", ErrTemplateExists, err)
		}
		return nil, res, Meta{}, fmt.Errorf("import template %s: %w", name, err)
	}
	m, err := Import(ctx, repo, name, img, o.Progress)
	if err != nil {
		// Ours (PutMeta was create-once), unless another import of the
		// name won the manifest: then the template is theirs, with it.
		if !errors.Is(err, ErrTemplateExists) {
			if derr := repo.DeleteMeta(context.WithoutCancel(ctx), vol); derr != nil {
				err = errors.Join(err, derr)
			}
		}
		return nil, res, Meta{}, err
	}
	ok = true
	return m, res, meta, o.Trees.publishImported(o.tree, name)
}

// maxIDFile bounds what is read of the image's /etc/passwd and /etc/group.
const maxIDFile = 1 << 20

// resolveUser turns an image config's user (NAME, UID, NAME:GROUP,
// UID:GID, ...) into ids, looked up in the tree's /etc/passwd and
// /etc/group as Docker does: a numeric user missing from passwd is that
// uid with gid 0; a name that is not there is an error.
func resolveUser(root *os.Root, user string) (uid, gid uint32, err error) {
	if user == "" {
		return 0, 0, nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	if u == "" || (hasGroup && g == "") {
		return 0, 0, fmt.Errorf("image user %q: want USER[:GROUP]: %w", user, ErrBadSource)
	}
	passwd, err := idFile(root, "etc/passwd")
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
	groups, err := idFile(root, "etc/group")
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

// idFile reads a passwd-style file of the tree as lines of at least four
// colon-separated fields (group lines are padded); a missing file is none.
func idFile(root *os.Root, name string) ([][]string, error) {
	f, err := root.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, escapeErr(name, fmt.Errorf("open image's /%s: %w", name, err))
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(io.LimitReader(f, maxIDFile))
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
