// Package recipe builds a template's root tree from a short recipe: a
// Debian suite (mmdebstrap into a directory, which leaves the host's own
// packages alone), Debian packages, files and commands run in the tree's
// chroot at build time. The tree is cached by the digest of what makes
// it, so an unchanged recipe is never built again; the template is
// imported from it like a local directory, and the recipe, its digest and
// its languages are recorded beside the template in the block store.
package recipe

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/snippet"
)

// Bounds of a recipe.
const (
	MaxRecipeBytes = 1 << 20
	MaxPackages    = 512
	MaxFiles       = 256
	MaxFileBytes   = 256 << 10
	MaxCommands    = 64
	MaxCommandLen  = 16 << 10
)

// DefaultMirror is the Debian mirror a base without one uses.
const DefaultMirror = "http://deb.debian.org/debian"

// Recipe is a parsed recipe file (TOML).
type Recipe struct {
	// Languages are what the code call runs in the template's sandboxes.
	Languages []string `toml:"languages" json:"languages,omitempty"`
	// Size is the template's device size (default 1Gi).
	Size     string   `toml:"size" json:"size,omitempty"`
	Packages []string `toml:"packages" json:"packages,omitempty"`
	// Commands run in order in the tree's chroot (as root, /bin/sh -e),
	// after the packages and files are in.
	Commands []string `toml:"commands" json:"commands,omitempty"`
	Base     Base     `toml:"base" json:"base"`
	Files    []File   `toml:"file" json:"files,omitempty"`
}

// Base is where the tree starts: a Debian suite, or a template built
// from a recipe (Template; then nothing else): the recipe is that
// template's with this one's packages, files (a path of both: this one's)
// and commands (after the base's) added, built from the suite as one
// recipe (see On). A template from elsewhere (a registry) cannot be a
// base: its programs would run as root on the host at build time.
type Base struct {
	Template string `toml:"template" json:"template,omitempty"`
	Suite    string `toml:"suite" json:"suite"`
	// Variant is mmdebstrap's: essential, minbase (default) or apt.
	Variant string `toml:"variant" json:"variant,omitempty"`
	Mirror  string `toml:"mirror" json:"mirror,omitempty"`
}

// File is a file put into the tree.
type File struct {
	Path    string `toml:"path" json:"path"`
	Content string `toml:"content" json:"content"`
	// Mode is octal, as text ("0644", the default).
	Mode string `toml:"mode" json:"mode,omitempty"`
}

var (
	suiteRe   = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)
	packageRe = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]{0,127}$`)
	fileRe    = regexp.MustCompile(`^/[A-Za-z0-9._+@/-]+$`)
	mirrorRe  = regexp.MustCompile(`^https?://[A-Za-z0-9.:-]+(/[A-Za-z0-9._~/-]*)?$`)
)

// Parse reads a recipe, refusing unknown keys, and checks it.
func Parse(b []byte) (Recipe, error) {
	if len(b) > MaxRecipeBytes {
		return Recipe{}, fmt.Errorf("parse recipe: %d bytes, at most %d", len(b), MaxRecipeBytes)
	}
	var r Recipe
	md, err := toml.NewDecoder(bytes.NewReader(b)).Decode(&r)
	if err != nil {
		return Recipe{}, fmt.Errorf("parse recipe: %w", err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		var keys []string
		for _, k := range und {
			keys = append(keys, k.String())
		}
		return Recipe{}, fmt.Errorf("parse recipe: unknown keys %s", strings.Join(keys, ", "))
	}
	r = r.normal()
	if err := r.Validate(); err != nil {
		return Recipe{}, err
	}
	return r, nil
}

// normal fills the defaults, so two recipes that mean the same have the
// same digest.
func (r Recipe) normal() Recipe {
	if r.Size == "" {
		r.Size = "1Gi"
	}
	if r.Base.Variant == "" && r.Base.Template == "" {
		r.Base.Variant = "minbase"
	}
	if r.Base.Mirror == "" && r.Base.Template == "" {
		r.Base.Mirror = DefaultMirror
	}
	r.Packages = slices.Clone(r.Packages)
	slices.Sort(r.Packages)
	r.Packages = slices.Compact(r.Packages)
	r.Languages = slices.Clone(r.Languages)
	slices.Sort(r.Languages)
	r.Languages = slices.Compact(r.Languages)
	r.Files = slices.Clone(r.Files)
	for i := range r.Files {
		if r.Files[i].Mode == "" {
			r.Files[i].Mode = "0644"
		}
	}
	return r
}

// Validate checks every field against its bounds and pattern: the values
// become mmdebstrap's arguments and paths in the tree.
func (r Recipe) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if r.Base.Template != "" {
		if !names.Valid(r.Base.Template) {
			bad("base.template %q: a template name (%s)", r.Base.Template, names.Rule)
		}
		if r.Base.Suite != "" || r.Base.Variant != "" || r.Base.Mirror != "" {
			bad("base.template %q with base.suite, variant or mirror: the template's recipe names them", r.Base.Template)
		}
	} else {
		if !suiteRe.MatchString(r.Base.Suite) {
			bad("base.suite %q: a Debian suite name (bookworm, trixie, ...)", r.Base.Suite)
		}
		if !slices.Contains([]string{"essential", "minbase", "apt"}, r.Base.Variant) {
			bad("base.variant %q: essential, minbase or apt", r.Base.Variant)
		}
		if !mirrorRe.MatchString(r.Base.Mirror) {
			bad("base.mirror %q: an http(s) URL", r.Base.Mirror)
		}
	}
	if len(r.Packages) > MaxPackages {
		bad("%d packages: at most %d", len(r.Packages), MaxPackages)
	}
	for _, p := range r.Packages {
		if !packageRe.MatchString(p) {
			bad("package %q: not a Debian package name", p)
		}
	}
	for _, l := range r.Languages {
		if _, err := snippet.Lookup(l); err != nil {
			bad("languages: %v", err)
		}
	}
	if len(r.Files) > MaxFiles {
		bad("%d files: at most %d", len(r.Files), MaxFiles)
	}
	seen := map[string]bool{}
	for _, f := range r.Files {
		switch {
		case len(f.Path) > 1024 || f.Path == "/" || !fileRe.MatchString(f.Path) || path.Clean(f.Path) != f.Path || strings.Contains(f.Path, "/../") || strings.HasSuffix(f.Path, "/.."):
			bad("file path %q: absolute, clean, of letters, digits and ._+@-", f.Path)
		case seen[f.Path]:
			bad("file path %q twice", f.Path)
		case len(f.Content) > MaxFileBytes:
			bad("file %s: %d bytes, at most %d", f.Path, len(f.Content), MaxFileBytes)
		}
		seen[f.Path] = true
		if m, err := strconv.ParseUint(f.Mode, 8, 32); err != nil || m > 0o7777 {
			bad("file %s: mode %q is not octal permission bits", f.Path, f.Mode)
		}
	}
	if len(r.Commands) > MaxCommands {
		bad("%d commands: at most %d", len(r.Commands), MaxCommands)
	}
	for i, c := range r.Commands {
		if len(c) > MaxCommandLen || strings.ContainsRune(c, 0) || strings.TrimSpace(c) == "" {
			bad("command %d: empty, NUL or longer than %d bytes", i+1, MaxCommandLen)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid recipe: %w", errors.Join(errs...))
	}
	return nil
}

// digestOf is the hex SHA-256 of v's JSON with a format version: a
// change of the recipe format changes every digest.
func digestOf(v any) string {
	b, err := json.Marshal(struct {
		Format int `json:"format"`
		V      any `json:"v"`
	}{1, v})
	if err != nil {
		panic(err) // plain data: cannot fail
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Digest identifies the whole recipe (what the template records).
func (r Recipe) Digest() string { return digestOf(r.normal()) }

// TreeDigest identifies what makes the tree (base, packages, files,
// commands): the key of the build cache.
func (r Recipe) TreeDigest() string {
	n := r.normal()
	return digestOf(struct {
		Base     Base
		Packages []string
		Files    []File
		Commands []string
	}{n.Base, n.Packages, n.Files, n.Commands})
}

// On is r on base (the resolved recipe of r.Base.Template): base's suite,
// its packages and r's, its files and r's (r's where both have a path),
// its commands then r's, both's languages, r's size.
func (r Recipe) On(base Recipe) Recipe {
	r, base = r.normal(), base.normal()
	out := Recipe{Size: r.Size, Base: base.Base}
	out.Packages = append(slices.Clone(base.Packages), r.Packages...)
	out.Languages = append(slices.Clone(base.Languages), r.Languages...)
	mine := map[string]bool{}
	for _, f := range r.Files {
		mine[f.Path] = true
	}
	for _, f := range base.Files {
		if !mine[f.Path] {
			out.Files = append(out.Files, f)
		}
	}
	out.Files = append(out.Files, r.Files...)
	out.Commands = append(slices.Clone(base.Commands), r.Commands...)
	return out.normal()
}
