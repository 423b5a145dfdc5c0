package template

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// node is one object of a tree as the tests compare it: from the source
// they wrote, and from the image as debugfs reads it (never mounted).
type node struct {
	Mode    uint32 // st_mode: type and permission bits
	UID     int
	GID     int
	Target  string // symlink
	Content string // regular file
}

func needTools(t testing.TB) {
	t.Helper()
	for _, b := range []string{"mkfs.ext4", "debugfs", "e2fsck"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Fatalf("%s not installed (e2fsprogs; test/vm/setup.sh installs it): %v", b, err)
		}
	}
}

func debugfs(t *testing.T, img, req string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", req, img).Output()
	if err != nil {
		t.Fatalf("debugfs -R %q %s: %v", req, img, err)
	}
	return string(out)
}

// debugfsBatch runs cmds in one debugfs process (one process per command
// is slow under the VM's TCG) and returns each command's output.
func debugfsBatch(t *testing.T, img string, cmds []string) []string {
	t.Helper()
	script := filepath.Join(t.TempDir(), "cmds")
	if err := os.WriteFile(script, []byte(strings.Join(cmds, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("debugfs", "-f", script, img).Output()
	if err != nil {
		t.Fatalf("debugfs -f %s: %v", img, err)
	}
	// debugfs echoes each command as "debugfs: CMD" before its output.
	parts := strings.Split("\n"+string(out), "\ndebugfs: ")[1:]
	if len(parts) != len(cmds) {
		t.Fatalf("debugfs answered %d of %d commands:\n%s", len(parts), len(cmds), out)
	}
	for i, p := range parts {
		cmd, rest, _ := strings.Cut(p, "\n")
		if cmd != cmds[i] {
			t.Fatalf("debugfs output %d is for %q, want %q", i, cmd, cmds[i])
		}
		parts[i] = rest
	}
	return parts
}

// imageTree reads an ext4 image's whole tree with debugfs: `ls -l -p` per
// directory (inode/mode/uid/gid/name/size), `stat` for symlink targets and
// `dump` for file contents. lost+found, which mkfs adds, is left out.
func imageTree(t *testing.T, img string) map[string]node {
	t.Helper()
	tree := map[string]node{}
	var links, files []string
	for dirs := []string{"/"}; len(dirs) > 0; {
		var cmds []string
		for _, d := range dirs {
			cmds = append(cmds, fmt.Sprintf("ls -l -p \"%s\"", d))
		}
		outs := debugfsBatch(t, img, cmds)
		var next []string
		for i, dir := range dirs {
			for _, l := range strings.Split(outs[i], "\n") {
				f := strings.Split(l, "/")
				if len(f) < 7 {
					continue
				}
				name := f[5]
				if name == "." || name == ".." || (dir == "/" && name == "lost+found") {
					continue
				}
				mode, err := strconv.ParseUint(f[2], 8, 32)
				if err != nil {
					t.Fatalf("debugfs ls line %q: %v", l, err)
				}
				uid, _ := strconv.Atoi(f[3])
				gid, _ := strconv.Atoi(f[4])
				p := strings.TrimPrefix(path.Join(dir, name), "/")
				tree[p] = node{Mode: uint32(mode), UID: uid, GID: gid}
				switch mode & syscall.S_IFMT {
				case syscall.S_IFDIR:
					next = append(next, "/"+p)
				case syscall.S_IFLNK:
					links = append(links, p)
				case syscall.S_IFREG:
					files = append(files, p)
				}
			}
		}
		dirs = next
	}
	dumps := t.TempDir()
	cmds := []string{"stat /"}
	for _, p := range links {
		cmds = append(cmds, fmt.Sprintf("stat \"/%s\"", p))
	}
	for i, p := range files {
		cmds = append(cmds, fmt.Sprintf("dump \"/%s\" \"%s/%d\"", p, dumps, i))
	}
	outs := debugfsBatch(t, img, cmds)
	tree["."] = rootNode(t, outs[0])
	for i, p := range links {
		_, after, ok := strings.Cut(outs[1+i], "Fast link dest: \"")
		if !ok {
			t.Fatalf("no fast link dest for %s:\n%s", p, outs[1+i])
		}
		n := tree[p]
		line, _, _ := strings.Cut(after, "\n")
		n.Target = strings.TrimSuffix(line, "\"")
		tree[p] = n
	}
	for i, p := range files {
		b, err := os.ReadFile(filepath.Join(dumps, strconv.Itoa(i)))
		if err != nil {
			t.Fatalf("dump of %s: %v", p, err)
		}
		n := tree[p]
		n.Content = string(b)
		tree[p] = n
	}
	return tree
}

// rootNode parses the root directory's mode and owner from `stat /`.
func rootNode(t *testing.T, st string) node {
	t.Helper()
	var n node
	for _, l := range strings.Split(st, "\n") {
		if strings.HasPrefix(l, "Inode: ") {
			_, m, _ := strings.Cut(l, "Mode:")
			v, err := strconv.ParseUint(strings.Fields(m)[0], 8, 32)
			if err != nil {
				t.Fatalf("root mode in %q: %v", l, err)
			}
			n.Mode = uint32(v) | syscall.S_IFDIR
		}
		if strings.HasPrefix(l, "User: ") {
			f := strings.Fields(l)
			n.UID, _ = strconv.Atoi(f[1])
			n.GID, _ = strconv.Atoi(f[3])
		}
	}
	return n
}

func fsck(t *testing.T, img string) {
	t.Helper()
	if out, err := exec.Command("e2fsck", "-fn", img).CombinedOutput(); err != nil {
		t.Fatalf("e2fsck -fn %s: %v\n%s", img, err, out)
	}
}

// tent is one tar entry a test writes; want (if set) is how it must appear
// in the image.
type tent struct {
	h       tar.Header
	content string
}

func mkTar(t testing.TB, es []tent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := e.h
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.content))
		}
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1700000000, 0)
		}
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.WriteString(tw, e.content); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func dirH(name string, mode int64, uid, gid int) tar.Header {
	return tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, Uid: uid, Gid: gid}
}
func regH(name string, mode int64, uid, gid int) tar.Header {
	return tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Uid: uid, Gid: gid}
}
func linkH(name, target string) tar.Header {
	return tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}
}

// sampleTree is a tree with what templates must keep: owners other than
// root, setuid and sticky bits, a read-only directory with a file in it,
// symlinks, a hard link, a name with a space, an xattr; plus a device node
// and a fifo that must be skipped.
func sampleTree() ([]tent, map[string]node) {
	es := []tent{
		{h: dirH("./", 0o755, 0, 0)},
		{h: dirH("bin/", 0o755, 0, 0)},
		{h: regH("bin/su", 0o4755, 0, 0), content: "setuid binary"},
		{h: linkH("bin/sh", "su")},
		{h: dirH("tmp/", 0o1777, 0, 0)},
		{h: dirH("home/", 0o755, 0, 0)},
		{h: dirH("home/app/", 0o750, 1000, 1000)},
		{h: regH("home/app/secret", 0o640, 1000, 1000), content: "app data\n"},
		{h: regH("home/app/with space", 0o644, 1000, 100), content: "spaced"},
		{h: tar.Header{Typeflag: tar.TypeLink, Name: "home/app/hard", Linkname: "home/app/secret"}},
		{h: dirH("ro/", 0o555, 0, 0)},
		{h: regH("ro/inside", 0o444, 0, 0), content: "read only"},
		{h: linkH("abs", "/etc/passwd")},
		{h: tar.Header{Typeflag: tar.TypeChar, Name: "dev-null", Mode: 0o666, Devmajor: 1, Devminor: 3}},
		{h: tar.Header{Typeflag: tar.TypeFifo, Name: "fifo", Mode: 0o644}},
		{h: tar.Header{Typeflag: tar.TypeReg, Name: "xattr-file", Mode: 0o644,
			// trusted.* needs CAP_SYS_ADMIN: a non-root builder cannot set
			// it on the stage, so debugfs must.
			PAXRecords: map[string]string{"SCHILY.xattr.user.template": "yes", "SCHILY.xattr.trusted.ctld": "t1"}}, content: "x"},
	}
	d, r, l := uint32(syscall.S_IFDIR), uint32(syscall.S_IFREG), uint32(syscall.S_IFLNK)
	want := map[string]node{
		".":                   {Mode: d | 0o755},
		"bin":                 {Mode: d | 0o755},
		"bin/su":              {Mode: r | 0o4755, Content: "setuid binary"},
		"bin/sh":              {Mode: l | 0o777, Target: "su"},
		"tmp":                 {Mode: d | 0o1777},
		"home":                {Mode: d | 0o755},
		"home/app":            {Mode: d | 0o750, UID: 1000, GID: 1000},
		"home/app/secret":     {Mode: r | 0o640, UID: 1000, GID: 1000, Content: "app data\n"},
		"home/app/hard":       {Mode: r | 0o640, UID: 1000, GID: 1000, Content: "app data\n"},
		"home/app/with space": {Mode: r | 0o644, UID: 1000, GID: 100, Content: "spaced"},
		"ro":                  {Mode: d | 0o555},
		"ro/inside":           {Mode: r | 0o444, Content: "read only"},
		"abs":                 {Mode: l | 0o777, Target: "/etc/passwd"},
		"xattr-file":          {Mode: r | 0o644, Content: "x"},
	}
	return es, want
}

func compareTree(t *testing.T, got, want map[string]node) {
	t.Helper()
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		g, gok := got[k]
		w, wok := want[k]
		switch {
		case !gok:
			t.Errorf("%s: missing from the image", k)
		case !wok:
			t.Errorf("%s: in the image, not in the source: %+v", k, g)
		case g != w:
			t.Errorf("%s: image has %+v, source %+v (mode %o vs %o)", k, g, w, g.Mode, w.Mode)
		}
	}
}

// hardLinked reports whether two paths of an image share an inode.
func hardLinked(t *testing.T, img, a, b string) bool {
	t.Helper()
	sa := debugfs(t, img, fmt.Sprintf("stat \"%s\"", a))
	sb := debugfs(t, img, fmt.Sprintf("stat \"%s\"", b))
	first := func(s string) string { l, _, _ := strings.Cut(s, "Type:"); return l }
	return first(sa) == first(sb) && strings.Contains(sa, "Links: 2")
}

// onlyFiles lists a directory so a test can check nothing was left behind.
func onlyFiles(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func build(t *testing.T, src Source, size int64) (string, ImageResult) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "root.ext4")
	res, err := BuildImage(context.Background(), src, out, ImageOptions{Size: size})
	if err != nil {
		t.Fatalf("BuildImage(%+v): %v", src, err)
	}
	return out, res
}

func TestBuildImageFromTar(t *testing.T) {
	needTools(t)
	es, want := sampleTree()
	raw := mkTar(t, es)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw)
	zw.Close()
	for name, data := range map[string][]byte{"tar": raw, "tar.gz": gz.Bytes()} {
		t.Run(name, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), "tree."+name)
			if err := os.WriteFile(src, data, 0o644); err != nil {
				t.Fatal(err)
			}
			img, res := build(t, Source{Path: src}, 16<<20)
			fsck(t, img)
			compareTree(t, imageTree(t, img), want)
			if !hardLinked(t, img, "/home/app/secret", "/home/app/hard") {
				t.Errorf("home/app/hard is not a hard link of home/app/secret")
			}
			checkXattrs(t, img)
			wantSkipped := []Skipped{{"dev-null", "device node or fifo"}, {"fifo", "device node or fifo"}}
			if !slices.Equal(res.Skipped, wantSkipped) {
				t.Errorf("skipped %v, want %v", res.Skipped, wantSkipped)
			}
		})
	}
}

// TestBuildImageNonRoot builds the sample tree as an unprivileged user (the
// test binary re-run as nobody when the test runs as root): mkfs.ext4 -d can
// only copy the builder's own uid from the stage, so ownership, setuid bits
// and the root's mode must still come out as the source says.
func TestBuildImageNonRoot(t *testing.T) {
	needTools(t)
	es, want := sampleTree()
	if os.Geteuid() != 0 {
		src := filepath.Join(t.TempDir(), "tree.tar")
		if err := os.WriteFile(src, mkTar(t, es), 0o644); err != nil {
			t.Fatal(err)
		}
		img, _ := build(t, Source{Path: src}, 16<<20)
		fsck(t, img)
		compareTree(t, imageTree(t, img), want)
		return
	}
	// t.TempDir's parents are 0700 root: nobody needs a directory it can reach.
	base, err := os.MkdirTemp("", "template-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(base, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(work, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(base, "tree.tar")
	if err := os.WriteFile(src, mkTar(t, es), 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(work, "root.ext4")
	// The test binary sits in a 0700 directory too: run a copy.
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "template.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Dir = base
	cmd.Env = append(os.Environ(), "CTLD_TEMPLATE_HELPER="+src+"\n"+img)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build as nobody: %v\n%s", err, out)
	}
	if fi, err := os.Stat(img); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 65534 {
		t.Fatalf("image not built by nobody: %v", err)
	}
	fsck(t, img)
	compareTree(t, imageTree(t, img), want)
	checkXattrs(t, img)
	if left := onlyFiles(t, work); !slices.Equal(left, []string{"root.ext4"}) {
		t.Errorf("work dir holds %v, want only root.ext4", left)
	}
}

// TestMain runs TestBuildImageNonRoot's unprivileged half when the test
// binary is started as its child (a hook, not a test, so nothing skips).
func TestMain(m *testing.M) {
	if arg := os.Getenv("CTLD_TEMPLATE_HELPER"); arg != "" {
		src, out, _ := strings.Cut(arg, "\n")
		if _, err := BuildImage(context.Background(), Source{Path: src}, out, ImageOptions{Size: 16 << 20}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestBuildImageProgress: the callback sees every entry and every content
// byte, in order, then the later phases.
func TestBuildImageProgress(t *testing.T) {
	needTools(t)
	var es []tent
	total := 0
	for i := range 50 {
		c := strings.Repeat("z", i*1000)
		total += len(c)
		es = append(es, tent{h: regH(fmt.Sprintf("f%02d", i), 0o644, 0, 0), content: c})
	}
	src := filepath.Join(t.TempDir(), "t.tar")
	if err := os.WriteFile(src, mkTar(t, es), 0o644); err != nil {
		t.Fatal(err)
	}
	var got []Progress
	out := filepath.Join(t.TempDir(), "root.ext4")
	res, err := BuildImage(t.Context(), Source{Path: src}, out, ImageOptions{Size: 16 << 20, Progress: func(p Progress) { got = append(got, p) }})
	if err != nil {
		t.Fatal(err)
	}
	var unpack []Progress
	var phases []string
	for _, p := range got {
		if p.Phase == "unpack" {
			unpack = append(unpack, p)
		} else {
			phases = append(phases, p.Phase)
		}
	}
	if len(unpack) != 50 {
		t.Fatalf("%d unpack reports, want 50", len(unpack))
	}
	for i, p := range unpack {
		if p.Entries != int64(i+1) || (i > 0 && p.Bytes < unpack[i-1].Bytes) {
			t.Fatalf("report %d: %+v after %+v", i, p, unpack[max(i-1, 0)])
		}
	}
	if last := unpack[49]; last.Bytes != int64(total) || res.Bytes != int64(total) || res.Entries != 50 {
		t.Errorf("last report %+v, result %+v; want %d bytes", last, res, total)
	}
	if !slices.Equal(phases, []string{"mkfs", "fixup", "done"}) {
		t.Errorf("phases %v, want mkfs, fixup, done", phases)
	}
}

// TestBuildImageFromBusyboxDir: the busybox template directory is one more
// directory source; the image has its layout, / is 0755 and /tmp sticky.
func TestBuildImageFromBusyboxDir(t *testing.T) {
	needTools(t)
	bb := fakeBusybox(t, "sh", "ls", "cat")
	// A 0700 directory (as os.MkdirTemp makes) must still give a 0755 /.
	dir, err := os.MkdirTemp(t.TempDir(), "busybox")
	if err != nil {
		t.Fatal(err)
	}
	if err := BuildBusybox(dir, bb); err != nil {
		t.Fatal(err)
	}
	// A device node in a directory source is skipped, not copied.
	if os.Geteuid() == 0 {
		if err := syscall.Mknod(filepath.Join(dir, "dev", "null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
			t.Fatal(err)
		}
	}
	img, res := build(t, Source{Kind: KindDir, Path: dir}, 16<<20)
	fsck(t, img)
	tree := imageTree(t, img)
	bbContent, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	uid, gid := os.Geteuid(), os.Getegid()
	d, r, l := uint32(syscall.S_IFDIR), uint32(syscall.S_IFREG), uint32(syscall.S_IFLNK)
	want := map[string]node{
		".":           {Mode: d | 0o755},
		"bin":         {Mode: d | 0o755, UID: uid, GID: gid},
		"bin/busybox": {Mode: r | 0o755, UID: uid, GID: gid, Content: string(bbContent)},
		"bin/sh":      {Mode: l | 0o777, UID: uid, GID: gid, Target: "busybox"},
		"bin/ls":      {Mode: l | 0o777, UID: uid, GID: gid, Target: "busybox"},
		"bin/cat":     {Mode: l | 0o777, UID: uid, GID: gid, Target: "busybox"},
		"dev":         {Mode: d | 0o755, UID: uid, GID: gid},
		"etc":         {Mode: d | 0o755, UID: uid, GID: gid},
		"etc/passwd":  {Mode: r | 0o644, UID: uid, GID: gid, Content: passwd},
		"etc/group":   {Mode: r | 0o644, UID: uid, GID: gid, Content: group},
		"etc/hosts":   {Mode: r | 0o644, UID: uid, GID: gid, Content: hosts},
		"proc":        {Mode: d | 0o555, UID: uid, GID: gid},
		"root":        {Mode: d | 0o700, UID: uid, GID: gid},
		"sys":         {Mode: d | 0o555, UID: uid, GID: gid},
		"tmp":         {Mode: d | 0o1777, UID: uid, GID: gid},
		"usr":         {Mode: d | 0o755, UID: uid, GID: gid},
		"usr/bin":     {Mode: l | 0o777, UID: uid, GID: gid, Target: "../bin"},
	}
	compareTree(t, tree, want)
	if os.Geteuid() == 0 && (len(res.Skipped) != 1 || res.Skipped[0].Path != "dev/null") {
		t.Errorf("skipped %v, want dev/null", res.Skipped)
	}
}

func checkXattrs(t *testing.T, img string) {
	t.Helper()
	for name, want := range map[string]string{"user.template": "yes", "trusted.ctld": "t1"} {
		if ea := debugfs(t, img, "ea_get /xattr-file "+name); !strings.Contains(ea, want) {
			t.Errorf("xattr %s of /xattr-file: debugfs ea_get says %q, want %q", name, ea, want)
		}
	}
}

// TestBuildImageProgressLargeFile: one large file reports while it is
// copied, not only when it is done.
func TestBuildImageProgressLargeFile(t *testing.T) {
	needTools(t)
	src := filepath.Join(t.TempDir(), "t.tar")
	if err := os.WriteFile(src, mkTar(t, []tent{{h: regH("big", 0o644, 0, 0), content: strings.Repeat("b", 40<<20)}}), 0o644); err != nil {
		t.Fatal(err)
	}
	var during []int64
	out := filepath.Join(t.TempDir(), "root.ext4")
	_, err := BuildImage(t.Context(), Source{Path: src}, out, ImageOptions{Size: 64 << 20, Progress: func(p Progress) {
		if p.Phase == "unpack" && p.Entries == 0 {
			during = append(during, p.Bytes)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(during) != 2 || during[0] < 16<<20 || during[1] < 32<<20 {
		t.Errorf("reports while copying a 40 MiB file: %v bytes, want two (past 16 and 32 MiB)", during)
	}
}
