package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
	"github.com/ctld/ctld/internal/blockstore/s3store/s3test"
)

func TestCLITemplate(t *testing.T) {
	for _, b := range []string{"mkfs.ext4", "debugfs", "e2fsck"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Fatalf("%s not installed (e2fsprogs): %v", b, err)
		}
	}
	dir := t.TempDir()
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "etc/", Mode: 0o755})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/motd", Mode: 0o644, Size: 5})
	tw.Write([]byte("hello"))
	// Text that S2 and zstd shrink: --compress=none stores it as it is.
	// (Numbered lines: identical chunks would be stored once either way.)
	var text []byte
	for i := range 1 << 15 {
		text = fmt.Appendf(text, "line %d of a text file in a template\n", i)
	}
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/text", Mode: 0o644, Size: int64(len(text))})
	tw.Write(text)
	tw.Close()
	src := filepath.Join(dir, "tree.tar")
	if err := os.WriteFile(src, tb.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--store", filepath.Join(dir, "store"), "--node-key", filepath.Join(dir, "node.key")}
	tmpl := func(args ...string) result {
		var out, errb bytes.Buffer
		code := run(context.Background(), append(append([]string{"template"}, args...), flags...), strings.NewReader(""), &out, &errb, func(string) string { return "" })
		return result{code, out.String(), errb.String()}
	}

	if r := tmpl("ls"); r.code == 0 {
		t.Fatalf("ls before any import (no key, no store): exit 0: %s", r.stdout)
	}
	// A bad --compress is refused before anything is made (node key, store).
	for _, bad := range []string{"false", "lz4", "S2"} {
		r := tmpl("import", "base", src, "--size", "16Mi", "--compress="+bad)
		if r.code != exitUsage || !strings.Contains(r.stderr, "want s2, zstd or none") {
			t.Errorf("import --compress=%q: exit %d, want %d and the choices\n%s", bad, r.code, exitUsage, r.stderr)
		}
		if _, err := os.Stat(filepath.Join(dir, "node.key")); err == nil {
			t.Fatalf("import --compress=%q made the node key", bad)
		}
		if _, err := os.Stat(filepath.Join(dir, "store")); err == nil {
			t.Fatalf("import --compress=%q made the store", bad)
		}
	}
	r := tmpl("import", "base", src, "--size", "16Mi")
	if r.code != 0 {
		t.Fatalf("import: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, fmt.Sprintf("template base: 3 entries, file data %d, device 16Mi", 5+len(text))) || !strings.Contains(r.stderr, "unpack:") || !strings.Contains(r.stderr, "stored:") {
		t.Errorf("import output:\nstdout: %s\nstderr: %s", r.stdout, r.stderr)
	}
	if fi, err := os.Stat(filepath.Join(dir, "node.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("node key not created 0600: %v", err)
	}
	if r := tmpl("ls"); r.code != 0 || !strings.Contains(r.stdout, "base") || !strings.Contains(r.stdout, "16Mi") {
		t.Errorf("ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := tmpl("import", "base", src, "--size", "16Mi"); r.code != exitFailed || !strings.Contains(r.stderr, "template exists") {
		t.Errorf("second import: exit %d\n%s", r.code, r.stderr)
	}
	for _, c := range []string{"none", "zstd", "s2"} {
		if r := tmpl("import", "c-"+c, src, "--size", "16Mi", "--compress="+c); r.code != 0 {
			t.Fatalf("import --compress=%s: exit %d\n%s%s", c, r.code, r.stdout, r.stderr)
		}
	}
	// The default is S2: what each flag stored says so in its chunk
	// objects' headers (flags: 0 raw, 1 zstd, 2 S2).
	byFlags := map[string]map[byte]int{}
	for _, name := range []string{"base", "c-none", "c-zstd", "c-s2"} {
		byFlags[name] = chunkFlags(t, filepath.Join(dir, "store"), filepath.Join(dir, "node.key"), name)
	}
	if !maps.Equal(byFlags["base"], byFlags["c-s2"]) || byFlags["base"][2] == 0 || byFlags["base"][1] != 0 ||
		byFlags["c-none"][0] == 0 || len(byFlags["c-none"]) != 1 || byFlags["c-zstd"][1] == 0 || byFlags["c-zstd"][2] != 0 {
		t.Errorf("chunk objects by flags: %v; want S2 (2) by default and for s2, zstd (1) for zstd, raw (0) only for none", byFlags)
	}
	size := func(name string) int64 { return duBytes(t, filepath.Join(dir, "store", "templates", name)) }
	plain, s2, zstd := size("c-none"), size("base"), size("c-zstd")
	t.Logf("stored: %d bytes with S2, %d with zstd, %d with --compress=none (file data %d)", s2, zstd, plain, 5+len(text))
	if plain < int64(len(text)) || s2*4 > plain || zstd > s2 {
		t.Errorf("stored bytes: %d S2, %d zstd, %d none; want the file data whole without, a quarter or less with S2, zstd no larger", s2, zstd, plain)
	}
	for _, name := range []string{"c-none", "c-zstd", "c-s2"} {
		if r := tmpl("rm", name); r.code != 0 {
			t.Errorf("rm %s: exit %d\n%s", name, r.code, r.stderr)
		}
	}
	if r := tmpl("import", "other", src, "--size", "1000000"); r.code != exitUsage {
		t.Errorf("import with a size not a multiple of 64Ki: exit %d\n%s", r.code, r.stderr)
	}
	if r := tmpl("rm", "base"); r.code != 0 {
		t.Errorf("rm: exit %d\n%s", r.code, r.stderr)
	}
	if r := tmpl("ls"); r.code != 0 || !strings.Contains(r.stdout, "no templates") {
		t.Errorf("ls after rm: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := tmpl("rm", "base"); r.code != exitFailed || !strings.Contains(r.stderr, "template not found") {
		t.Errorf("second rm: exit %d\n%s", r.code, r.stderr)
	}
	// Nothing of the builds is left beside the store.
	es, _ := os.ReadDir(dir)
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "node.key store tree.tar" {
		t.Errorf("left in the work dir: %v", names)
	}
}

// chunkFlags counts the chunk objects under dir by their header's flags
// byte ("CTBO", version, kind, flags).
func chunkFlags(t *testing.T, storeDir, keyFile, name string) map[byte]int {
	t.Helper()
	ctx := context.Background()
	nk, err := blockstore.LoadNodeKeyFile(keyFile, "node")
	if err != nil {
		t.Fatal(err)
	}
	st, err := dirstore.Open(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	repo, err := blockstore.New(st, nk, blockstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	im, err := repo.Open(ctx, blockstore.GenRef{Volume: blockstore.Template(name)})
	if err != nil {
		t.Fatal(err)
	}
	// Each data chunk's sealed object, loose or in a pack: its header's
	// flags byte.
	n := map[byte]int{}
	for i := range im.Chunks() {
		key, off, _, ok := im.ChunkObject(i)
		if !ok {
			continue
		}
		b, err := st.GetRange(ctx, key, off, 7, nil)
		if err != nil {
			t.Fatal(err)
		}
		n[b[6]]++
	}
	return n
}

// duBytes sums the sizes of the regular files under dir.
func duBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCLITemplateS3: import, ls and rm work on an S3 block store
// (versitygw), credentials from the environment; a wrong secret is
// refused naming the cause.
func TestCLITemplateS3(t *testing.T) {
	for _, b := range []string{"mkfs.ext4", "debugfs", "e2fsck"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Fatalf("%s not installed (e2fsprogs): %v", b, err)
		}
	}
	srv := s3test.Start(t)
	dir := t.TempDir()
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "motd", Mode: 0o644, Size: 5})
	tw.Write([]byte("hello"))
	tw.Close()
	src := filepath.Join(dir, "tree.tar")
	if err := os.WriteFile(src, tb.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--store", "s3://" + srv.NewBucket(t) + "/tpl", "--s3-endpoint", srv.Endpoint, "--node-key", filepath.Join(dir, "node.key"), "--tmp-dir", dir}
	tmpl := func(secret string, args ...string) result {
		var out, errb bytes.Buffer
		vars := map[string]string{"AWS_ACCESS_KEY_ID": srv.Access, "AWS_SECRET_ACCESS_KEY": secret}
		a := append(append([]string{"template"}, args...), flags...)
		if args[0] != "import" {
			a = a[:len(a)-2] // --tmp-dir is import's
		}
		code := run(context.Background(), a, strings.NewReader(""), &out, &errb, func(k string) string { return vars[k] })
		return result{code, out.String(), errb.String()}
	}
	if r := tmpl("wrong", "import", "base", src, "--size", "16Mi"); r.code != exitFailed || !strings.Contains(r.stderr, "denied (bad credentials") {
		t.Fatalf("import with a wrong secret: exit %d\n%s", r.code, r.stderr)
	}
	if r := tmpl(srv.Secret, "import", "base", src, "--size", "16Mi"); r.code != 0 || !strings.Contains(r.stdout, "template base: 1 entries, file data 5, device 16Mi") {
		t.Fatalf("import: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := tmpl(srv.Secret, "ls"); r.code != 0 || !strings.Contains(r.stdout, "base") || !strings.Contains(r.stdout, "16Mi") {
		t.Errorf("ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := tmpl(srv.Secret, "rm", "base"); r.code != 0 {
		t.Errorf("rm: exit %d\n%s", r.code, r.stderr)
	}
	if r := tmpl(srv.Secret, "ls"); r.code != 0 || !strings.Contains(r.stdout, "no templates") {
		t.Errorf("ls after rm: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
