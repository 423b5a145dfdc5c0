package recipe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/template"
)

// Record is what the block store keeps beside a template built from a
// recipe (key RecordKey): the recipe, its digests and its languages.
type Record struct {
	Recipe     Recipe    `json:"recipe"`
	Digest     string    `json:"digest"`
	TreeDigest string    `json:"tree_digest"`
	Languages  []string  `json:"languages"`
	BuiltAt    time.Time `json:"built_at"`
	// Resolved is the recipe built when Recipe's base is a template
	// (Recipe.On its base's resolved recipe); BaseDigest that base's
	// digest, part of Digest: a base built anew makes this out of date.
	Resolved   *Recipe `json:"resolved,omitempty"`
	BaseDigest string  `json:"base_digest,omitempty"`
}

// Resolve returns the recipe that builds r: r itself, or, when its base
// is a template, r on that template's recipe, and that template's
// digest. The base must be a template built from a recipe.
func Resolve(ctx context.Context, store blockstore.Store, r Recipe) (Recipe, string, error) {
	r = r.normal()
	if r.Base.Template == "" {
		return r, "", nil
	}
	rec, ok, err := ReadRecord(ctx, store, r.Base.Template)
	if err != nil {
		return Recipe{}, "", fmt.Errorf("base template: %w", err)
	}
	if !ok {
		return Recipe{}, "", fmt.Errorf("base template %s: not built from a recipe (or not there): a recipe's base is a recipe template, whose build runs only Debian's packages and recipes' commands: %w", r.Base.Template, template.ErrTemplateNotFound)
	}
	base := rec.Recipe
	if rec.Resolved != nil {
		base = *rec.Resolved
	}
	out := r.On(base)
	if err := out.Validate(); err != nil {
		return Recipe{}, "", fmt.Errorf("on base template %s: %w", r.Base.Template, err)
	}
	return out, rec.Digest, nil
}

// RecordKey is the store key of template name's record: inside the
// template's volume, so `template rm` removes it with the template, and
// GC leaves it (not a block store object).
func RecordKey(name string) string { return blockstore.Template(name).String() + "/recipe" }

// ReadRecord returns template name's record; ok is false when it has none.
func ReadRecord(ctx context.Context, store blockstore.Store, name string) (rec Record, ok bool, err error) {
	if err := blockstore.Template(name).Check(); err != nil {
		return rec, false, fmt.Errorf("read recipe record of %q: %w", name, err)
	}
	b, err := store.Get(ctx, RecordKey(name))
	if errors.Is(err, blockstore.ErrNotFound) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, fmt.Errorf("read recipe record of %s: %w", name, err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, false, fmt.Errorf("read recipe record of %s: %w", name, err)
	}
	return rec, true, nil
}

// Outcome is what Build did.
type Outcome struct {
	// UpToDate: the template exists, built from this recipe: nothing done.
	UpToDate bool
	// TreeCached: the tree came from the build cache (no mmdebstrap run).
	TreeCached bool
	Record     Record
	Manifest   *blockstore.Manifest
	Image      template.ImageResult
}

// Build makes template name from r: nothing when the template exists
// with r's digest; refused when it exists otherwise (templates are
// immutable: remove it first); else the tree (cached by its digest) is
// imported like a local directory and the record written. A record that
// cannot be written takes the template back out: a template from a
// recipe always has its record.
func Build(ctx context.Context, store blockstore.Store, repo *blockstore.Repo, b Builder, name string, r Recipe, size int64, tmpDir string, progress func(template.Progress)) (Outcome, error) {
	if err := blockstore.Template(name).Check(); err != nil {
		return Outcome{}, fmt.Errorf("build template %q: %w", name, err)
	}
	r = r.normal()
	if err := r.Validate(); err != nil {
		return Outcome{}, err
	}
	built, baseDigest, err := Resolve(ctx, store, r)
	if err != nil {
		return Outcome{}, fmt.Errorf("build template %s: %w", name, err)
	}
	rec := Record{Recipe: r, Digest: r.Digest(), TreeDigest: built.TreeDigest(), Languages: slices.Clone(built.Languages)}
	if baseDigest != "" {
		rec.Resolved, rec.BaseDigest = &built, baseDigest
		rec.Digest = digestOf(struct {
			Recipe Recipe
			Base   string
		}{r, baseDigest})
	}
	have, err := template.List(ctx, store, repo)
	if err != nil {
		return Outcome{}, fmt.Errorf("build template %s: %w", name, err)
	}
	block := slices.ContainsFunc(have, func(i template.Info) bool { return i.Name == name })
	tree, err := b.Trees.Has(name)
	if err != nil {
		return Outcome{}, fmt.Errorf("build template %s: %w", name, err)
	}
	if block || tree {
		old, ok, err := ReadRecord(ctx, store, name)
		switch {
		case err != nil:
			return Outcome{}, fmt.Errorf("build template %s: %w", name, err)
		case !ok:
			return Outcome{}, fmt.Errorf("build template %s: %w, not built from a recipe: remove it first (ctl-manager template rm)", name, template.ErrTemplateExists)
		case old.Digest != rec.Digest:
			return Outcome{}, fmt.Errorf("build template %s: %w, built from another recipe (digest %.12s, this one %.12s): remove it first (ctl-manager template rm)", name, template.ErrTemplateExists, old.Digest, rec.Digest)
		case b.TreeOnly && !tree:
			return Outcome{}, fmt.Errorf("build template %s: %w, from this recipe but without an overlay tree: remove it first (ctl-manager template rm)", name, template.ErrTemplateExists)
		case !b.TreeOnly && !block:
			return Outcome{}, fmt.Errorf("build template %s: %w, from this recipe as an overlay tree only (no block image): remove it first (ctl-manager template rm)", name, template.ErrTemplateExists)
		}
		return Outcome{UpToDate: true, TreeCached: true, Record: old}, nil
	}
	// An earlier build that died between its import and its record, or
	// a removed template's leftovers: a stale record goes first.
	if err := store.Delete(ctx, RecordKey(name)); err != nil {
		return Outcome{}, fmt.Errorf("build template %s: %w", name, err)
	}
	root, hit, err := b.Tree(ctx, built)
	if err != nil {
		return Outcome{}, err
	}
	m, res, err := template.ImportSource(ctx, repo, name, template.Source{Kind: template.KindDir, Path: root}, template.ImageOptions{Size: size, Progress: progress, Trees: b.Trees, TreeOnly: b.TreeOnly}, tmpDir)
	if err != nil {
		return Outcome{}, fmt.Errorf("build template %s: %w", name, err)
	}
	rec.BuiltAt = time.Now().UTC()
	blob, err := json.Marshal(rec)
	if err == nil {
		err = store.Put(ctx, RecordKey(name), blob)
	}
	if err != nil {
		rerr := b.Trees.RemoveTemplate(context.WithoutCancel(ctx), store, repo, name)
		return Outcome{}, errors.Join(fmt.Errorf("build template %s: record its recipe: %w", name, err), rerr)
	}
	return Outcome{TreeCached: hit, Record: rec, Manifest: m, Image: res}, nil
}
