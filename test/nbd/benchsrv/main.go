// Command benchsrv is the "our server" side of test/nbd/bench.sh: it
// writes the benchmark's base image, imports it as a block-store
// generation, and serves a copy-on-write device over that generation
// (cowdev + nbdsrv, the writer's stack) on a Unix socket.
//
//	benchsrv gen    -image FILE -size BYTES
//	benchsrv import -store DIR -key FILE -name NAME -image FILE
//	benchsrv serve  -store DIR -key FILE -name NAME -dir DIR -socket PATH
//
// serve prints "ready" on stdout once it listens and stops on SIGTERM or
// SIGINT.
package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/ctld/ctld/internal/basecache"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
	"github.com/ctld/ctld/internal/cowdev"
	"github.com/ctld/ctld/internal/nbdsrv"
	"github.com/ctld/ctld/internal/template"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: benchsrv gen|import|serve [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	fl := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	image := fl.String("image", "", "raw image file")
	size := fl.Int64("size", 1<<30, "image size in bytes (gen)")
	store := fl.String("store", "", "block store directory")
	keyFile := fl.String("key", "", "node key file (created if missing)")
	name := fl.String("name", "bench", "template name")
	dir := fl.String("dir", "", "cowdev directory (dirty file, index, cache)")
	sock := fl.String("socket", "", "Unix socket to serve on")
	cpuProfile := fl.String("cpuprofile", "", "write a CPU profile of serve to this file")
	baseCache := fl.String("base-cache", "", "the node's base cache directory, as ctld hands its writers (serve; empty: none)")
	compress := fl.String("compress", "s2", "compression of the imported chunks: s2, zstd or none (import)")
	_ = fl.Parse(os.Args[2:])
	var err error
	switch os.Args[1] {
	case "gen":
		err = gen(*image, *size)
	case "import":
		err = importImage(ctx, *store, *keyFile, *name, *image, *compress)
	case "serve":
		if *cpuProfile != "" {
			f, perr := os.Create(*cpuProfile)
			if perr == nil {
				perr = pprof.StartCPUProfile(f)
			}
			if perr != nil {
				fmt.Fprintln(os.Stderr, "benchsrv:", perr)
				os.Exit(1)
			}
			defer pprof.StopCPUProfile()
		}
		err = serve(ctx, *store, *keyFile, *name, *dir, *sock, *baseCache)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "benchsrv:", err)
		os.Exit(1)
	}
}

// gen writes a sparse image of mixed content, per 1 MiB region: 1/8 holes
// (never written), 3/8 random bytes (incompressible), 3/8 text-like
// records (compressible), 1/8 alternating 64 KiB chunks of random data
// and zeros. Deterministic (fixed seed).
func gen(path string, size int64) error {
	const region = 1 << 20
	if path == "" || size <= 0 || size%region != 0 {
		return errors.New("gen: -image and a -size that is a multiple of 1 MiB are required")
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, region)
	random := func(b []byte) {
		for i := 0; i+8 <= len(b); i += 8 {
			binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
		}
	}
	for off := int64(0); off < size; off += region {
		switch k := rng.IntN(8); {
		case k == 0:
			continue // a hole
		case k <= 3:
			random(buf)
		case k <= 6:
			var sb strings.Builder
			for sb.Len() < region {
				fmt.Fprintf(&sb, "%012d /usr/lib/x86_64-linux-gnu/lib%x.so.%d owner=root mode=0644 sum=%016x\n",
					off+int64(sb.Len()), rng.IntN(4096), rng.IntN(9), rng.Uint64()&0xffff)
			}
			copy(buf, sb.String())
		default:
			for c := 0; c < region; c += 64 << 10 {
				if (c/(64<<10))%2 == 0 {
					random(buf[c : c+64<<10])
				} else {
					clear(buf[c : c+64<<10])
				}
			}
		}
		if _, err := f.WriteAt(buf, off); err != nil {
			return err
		}
	}
	return f.Sync()
}

func openRepo(store, keyFile string, compress blockstore.Compression) (*blockstore.Repo, error) {
	if store == "" || keyFile == "" {
		return nil, errors.New("-store and -key are required")
	}
	var nk *blockstore.NodeKey
	b, err := os.ReadFile(keyFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		var raw []byte
		if nk, raw, err = blockstore.GenerateNodeKey("bench"); err != nil {
			return nil, err
		}
		if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(raw)), 0o600); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	default:
		raw, err := hex.DecodeString(strings.TrimSpace(string(b)))
		if err != nil {
			return nil, fmt.Errorf("key %s: %w", keyFile, err)
		}
		if nk, err = blockstore.NewNodeKey("bench", raw); err != nil {
			return nil, err
		}
	}
	st, err := dirstore.Open(store)
	if err != nil {
		return nil, err
	}
	return blockstore.New(st, nk, blockstore.Options{Compression: compress})
}

func importImage(ctx context.Context, store, keyFile, name, image, compress string) error {
	c, err := blockstore.ParseCompression(compress)
	if err != nil {
		return err
	}
	repo, err := openRepo(store, keyFile, c)
	if err != nil {
		return err
	}
	m, err := template.Import(ctx, repo, name, image, nil)
	if err != nil {
		return err
	}
	fmt.Printf("imported %s: %d data chunks of %d, device %d bytes\n", name, len(m.Entries), m.Chunks(), m.DeviceSize)
	return nil
}

func serve(ctx context.Context, store, keyFile, name, dir, sock, baseCache string) error {
	repo, err := openRepo(store, keyFile, blockstore.CompressNone) // reads take what each object says
	if err != nil {
		return err
	}
	if dir == "" || sock == "" {
		return errors.New("serve: -dir and -socket are required")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var shared *basecache.Cache
	if baseCache != "" {
		if shared, err = basecache.Open(baseCache, basecache.Options{Logger: log}); err != nil {
			return err
		}
	}
	dev, err := cowdev.Open(ctx, cowdev.Config{Repo: repo, Base: blockstore.GenRef{Volume: blockstore.Template(name)}, Dir: dir, LocalStore: true, Shared: shared, Logger: log})
	if err != nil {
		return err
	}
	defer dev.Close()
	srv, err := nbdsrv.New(nbdsrv.Export{Backend: dev}, nbdsrv.Options{Logger: log})
	if err != nil {
		return err
	}
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	return srv.Serve(ctx, l)
}
