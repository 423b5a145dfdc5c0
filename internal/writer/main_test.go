package writer_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/writer"
)

// TestMain lets the test binary stand in for ctld: `<test binary> writer
// --spec FILE` runs the same writer.RunFile as `ctld writer` does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "writer" {
		os.Exit(writerMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "primary" {
		os.Exit(primaryMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

func writerMain(args []string) int {
	fs := flag.NewFlagSet("writer", flag.ContinueOnError)
	spec := fs.String("spec", "", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := logging.New(os.Stderr, slog.LevelInfo)
	err := writer.RunFile(ctx, *spec, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "writer:", err)
	}
	return writer.ExitCode(err)
}

// store is a block store with a node key file, as the primary has it.
type store struct {
	dir, keyFile string
	repo         *blockstore.Repo
	ds           *dirstore.Store
}

func newStore(t testing.TB) *store {
	t.Helper()
	root := t.TempDir()
	nk, raw, err := blockstore.GenerateNodeKey("node-a")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(root, "node.key")
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(raw)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ds, err := dirstore.Open(filepath.Join(root, "store"))
	if err != nil {
		t.Fatal(err)
	}
	repo, err := blockstore.New(ds, nk, blockstore.Options{Compression: blockstore.CompressS2})
	if err != nil {
		t.Fatal(err)
	}
	return &store{dir: filepath.Join(root, "store"), keyFile: keyFile, repo: repo, ds: ds}
}

// template commits generation 0 of templates/<name>: size bytes, the
// given chunks (index → 64 KiB) and holes elsewhere.
func (s *store) template(t testing.TB, name string, size uint64, chunks map[uint64][]byte) blockstore.GenRef {
	t.Helper()
	ref := blockstore.GenRef{Volume: blockstore.Template(name), Generation: 0}
	if _, err := s.repo.Commit(context.Background(), blockstore.CommitSpec{Generation: ref, DeviceSize: size}, chunks); err != nil {
		t.Fatal(err)
	}
	return ref
}

func (s *store) spec(base blockstore.GenRef, dir string, epoch uint64) writer.Spec {
	return writer.Spec{
		Sandbox: "sb-1", Generation: 1, Epoch: epoch,
		StoreDir: s.dir, NodeKeyFile: s.keyFile, NodeKeyID: "node-a",
		Base: base, Dir: dir, Index: -1,
	}
}

// primaryMain stands in for a primary: `<test binary> primary SPEC ROOT
// CGROUP` starts a writer through a Supervisor, prints its State as one
// JSON line and waits to be killed.
func primaryMain(args []string) int {
	if len(args) != 3 {
		fmt.Fprintln(os.Stderr, "primary SPEC ROOT CGROUP")
		return 2
	}
	b, err := os.ReadFile(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var spec writer.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sup := &writer.Supervisor{Binary: exe, Root: args[1], Cgroup: args[2], Logger: logging.New(os.Stderr, slog.LevelInfo)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	st, err := sup.Start(ctx, spec)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	out, _ := json.Marshal(st)
	fmt.Println(string(out))
	select {} // until kill -9
}
