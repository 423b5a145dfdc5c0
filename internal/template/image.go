package template

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ImageOptions says what file system image to build.
type ImageOptions struct {
	Size     int64  // bytes; a multiple of 4096
	FSType   string // "ext4" (the default); XFS is refused, see BuildImage
	Label    string // file system label, optional (at most 16 bytes)
	Progress func(Progress)
	// Inspect, if set, reads the unpacked tree (through an os.Root: nothing
	// outside it) before the image is made: an error stops the build.
	Inspect func(*os.Root) error
	// Trees, if set, is where ImportSource and ImportImage keep the
	// unpacked tree as the template's overlay lower (Trees.Dir/NAME).
	Trees Trees
	// TreeOnly: ImportSource keeps only the overlay tree (Trees is
	// needed); no block image is built or stored, so the template serves
	// overlay claims only. Building and storing the image is most of an
	// import's time (minutes for a language runtime under emulation).
	TreeOnly bool
	// tree is where BuildImage moves the unpacked tree when the image is
	// built (an empty directory: Trees.begin), instead of removing it.
	tree string
	// transient: out is a scratch file the caller stores and removes (an
	// import), so it is not fsynced (the store's own writes are durable),
	// and the caller checks it (checkImage) while it uploads it.
	transient bool
	// noImage: only the tree is wanted (kept at tree, read by Inspect);
	// the image of the same layers is stored already.
	noImage bool
}

// ImageResult tells what went into an image.
type ImageResult struct {
	Entries int64
	Bytes   int64
	Skipped []Skipped // device nodes, fifos, sockets: not in the image
	// Base is the stored image of the same layers a registry template is
	// a fork of (see base.go); Reused says it was stored before, so this
	// import built and uploaded nothing.
	Base   string `json:",omitempty"`
	Reused bool   `json:",omitempty"`
}

// BuildImage makes a file system image at out from src, in userspace: the
// tree is unpacked into a stage directory next to out (safely: nothing
// escapes it), `mkfs.ext4 -d` copies it into a fresh image, debugfs sets
// what the stage could not carry (ownership for a non-root builder, the root
// directory's mode), and `e2fsck -fn` must find the result clean. out
// appears only when all of that succeeded; on any error nothing is left
// behind.
//
// XFS is not offered: mkfs.xfs builds from a protofile, which cannot express
// a sticky bit (/tmp), hard links, xattrs or names with spaces or colons.
func BuildImage(ctx context.Context, src Source, out string, o ImageOptions) (ImageResult, error) {
	var res ImageResult
	switch o.FSType {
	case "", "ext4":
	case "xfs":
		return res, fmt.Errorf("build %s: xfs (a protofile cannot carry sticky bits, hard links or xattrs): %w", out, ErrUnsupportedFS)
	default:
		return res, fmt.Errorf("build %s: %q: %w", out, o.FSType, ErrUnsupportedFS)
	}
	if o.Size <= 0 || o.Size%4096 != 0 {
		return res, fmt.Errorf("build %s: size %d is not a positive multiple of 4096", out, o.Size)
	}
	if len(o.Label) > 16 {
		return res, fmt.Errorf("build %s: label %q longer than 16 bytes", out, o.Label)
	}
	progress := func(p Progress) {
		if o.Progress != nil {
			o.Progress(p)
		}
	}
	stageDir := filepath.Dir(out)
	if o.tree != "" {
		stageDir = filepath.Dir(o.tree) // the tree is renamed out of the stage
	}
	stage, err := os.MkdirTemp(stageDir, "."+filepath.Base(out)+".stage-")
	if err != nil {
		return res, fmt.Errorf("create stage for %s: %w", out, err)
	}
	defer removeStage(stage)
	tree := filepath.Join(stage, "tree")
	if err := os.Mkdir(tree, 0o700); err != nil {
		return res, fmt.Errorf("create stage for %s: %w", out, err)
	}
	u, err := newUnpacker(tree, o.Progress, o.Size)
	if err != nil {
		return res, err
	}
	defer u.close()
	if err := feed(ctx, src, u, stage); err != nil {
		return res, fmt.Errorf("import %s: %w", src.Path, err)
	}
	fixes, err := u.finish()
	if err != nil {
		return res, fmt.Errorf("import %s: %w", src.Path, err)
	}
	res = ImageResult{Entries: u.entries, Bytes: u.bytes, Skipped: u.skipped}
	if o.Inspect != nil {
		if err := o.Inspect(u.root); err != nil {
			return res, fmt.Errorf("import %s: %w", src.Path, err)
		}
	}
	// Content alone beyond the size is certain failure; say so before mkfs.
	if need := u.blocks * 4096; need > o.Size {
		return res, fmt.Errorf("build %s: content needs %d bytes, size is %d: %w", out, need, o.Size, ErrImageTooSmall)
	}

	if o.noImage {
		if o.tree != "" {
			if err := unix.Rename(tree, o.tree); err != nil {
				return res, fmt.Errorf("keep the tree of %s: %w", out, err)
			}
		}
		progress(Progress{Phase: "done", Entries: u.entries, Bytes: u.bytes})
		return res, nil
	}
	progress(Progress{Phase: "mkfs", Entries: u.entries, Bytes: u.bytes})
	f, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp-")
	if err != nil {
		return res, fmt.Errorf("create image for %s: %w", out, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after the rename
	err = f.Truncate(o.Size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return res, fmt.Errorf("size image %s: %w", tmp, err)
	}
	args := []string{"-q", "-F", "-t", "ext4", "-b", "4096", "-d", tree}
	// mke2fs gives one inode per 16 KiB (4 KiB for small images); a tree of
	// many small files can need more.
	if need := u.entries + u.entries/4 + 64; need > o.Size/16384 {
		args = append(args, "-N", strconv.FormatInt(need, 10))
	}
	if o.Label != "" {
		args = append(args, "-L", o.Label)
	}
	args = append(args, tmp)
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", args...).CombinedOutput(); err != nil {
		msg := string(out)
		if strings.Contains(msg, "Could not allocate") || strings.Contains(msg, "No space left") ||
			strings.Contains(msg, "too small") || strings.Contains(msg, "inode_ratio") {
			return res, fmt.Errorf("mkfs.ext4 of %d bytes: %w: %s", o.Size, ErrImageTooSmall, strings.TrimSpace(msg))
		}
		return res, fmt.Errorf("mkfs.ext4 %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(msg))
	}
	progress(Progress{Phase: "fixup", Entries: u.entries, Bytes: u.bytes})
	if err := applyFixups(ctx, tmp, stage, fixes); err != nil {
		return res, err
	}
	if !o.transient {
		if err := checkImage(ctx, tmp); err != nil {
			return res, err
		}
	}
	if !o.transient {
		if err := syncFile(tmp); err != nil {
			return res, err
		}
	}
	if err := os.Rename(tmp, out); err != nil {
		return res, fmt.Errorf("rename image to %s: %w", out, err)
	}
	if !o.transient {
		if err := syncFile(filepath.Dir(out)); err != nil {
			return res, err
		}
	}
	if o.tree != "" {
		// rename(2) itself: os.Rename refuses to replace even an empty
		// directory.
		if err := unix.Rename(tree, o.tree); err != nil {
			return res, fmt.Errorf("keep the tree of %s: %w", out, err)
		}
	}
	progress(Progress{Phase: "done", Entries: u.entries, Bytes: u.bytes})
	return res, nil
}

// applyFixups sets, through one debugfs script, the ownership, mode and
// xattrs that mkfs.ext4 -d could not copy from the stage.
func applyFixups(ctx context.Context, img, stage string, fixes []fixup) error {
	if len(fixes) == 0 {
		return nil
	}
	var sb strings.Builder
	for i, fx := range fixes {
		p := "/" + fx.path
		if fx.path == "." {
			p = "/"
		}
		// debugfs splits its commands on blanks and takes a quoted word
		// whole; a name it cannot quote is refused rather than misapplied.
		if strings.ContainsAny(p, "\"\n\\") {
			return fmt.Errorf("set owner of %q in the image: name cannot be passed to debugfs: %w", fx.path, ErrUnsafePath)
		}
		q := `"` + p + `"`
		if fx.inode {
			m := fx.meta
			fmt.Fprintf(&sb, "sif %s uid %d\nsif %s gid %d\n", q, m.uid, q, m.gid)
			if m.typ != tar.TypeSymlink {
				fmt.Fprintf(&sb, "sif %s mode 0%o\n", q, unixMode(m))
			}
		}
		names := make([]string, 0, len(fx.xattrs))
		for k := range fx.xattrs {
			names = append(names, k)
		}
		slices.Sort(names)
		for j, k := range names {
			vf := filepath.Join(stage, fmt.Sprintf("xattr-%d-%d", i, j))
			if err := os.WriteFile(vf, []byte(fx.xattrs[k]), 0o600); err != nil {
				return fmt.Errorf("stage xattr value: %w", err)
			}
			if strings.ContainsAny(k, "\" \n\\") {
				return fmt.Errorf("xattr %q of %q: name cannot be passed to debugfs: %w", k, fx.path, ErrBadSource)
			}
			fmt.Fprintf(&sb, "ea_set -f \"%s\" %s %s\n", vf, q, k)
		}
	}
	script := filepath.Join(stage, "fixups.debugfs")
	if err := os.WriteFile(script, []byte(sb.String()), 0o600); err != nil {
		return fmt.Errorf("write debugfs script: %w", err)
	}
	cmd := exec.CommandContext(ctx, "debugfs", "-w", "-f", script, img)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("debugfs fixups: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	// debugfs exits 0 when a command fails; its complaints are on stderr
	// after the version banner.
	for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		if l != "" && !strings.HasPrefix(l, "debugfs ") {
			return fmt.Errorf("debugfs fixups: %s", strings.TrimSpace(stderr.String()))
		}
	}
	return nil
}

func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("open %s for sync: %w", p, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return fmt.Errorf("sync %s: %w", p, err)
	}
	return nil
}

// checkImage runs `e2fsck -fn` on the image file at img: it must be clean.
func checkImage(ctx context.Context, img string) error {
	if out, err := exec.CommandContext(ctx, "e2fsck", "-fn", img).CombinedOutput(); err != nil {
		return fmt.Errorf("e2fsck -fn of the new image: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
