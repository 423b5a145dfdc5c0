package s3store_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/s3store"
	"github.com/ctld/ctld/internal/blockstore/s3store/s3test"
	"github.com/ctld/ctld/internal/blockstore/storetest"
)

func TestContract(t *testing.T) {
	srv := s3test.Start(t)
	storetest.Run(t, func(t *testing.T) blockstore.Store { return srv.NewStore(t, "") })
}

// With a prefix, keys are stored under it and List strips it: the same
// contract, and nothing lands outside the prefix.
func TestContractWithPrefix(t *testing.T) {
	srv := s3test.Start(t)
	var last *s3store.Store
	storetest.Run(t, func(t *testing.T) blockstore.Store {
		last = srv.NewStore(t, "node-1/store")
		return last
	})
	out, err := last.Client().ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: aws.String(last.Bucket())})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range out.Contents {
		if !strings.HasPrefix(*o.Key, "node-1/store/") {
			t.Errorf("object %q outside the prefix", *o.Key)
		}
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	if _, err := s3store.New(s3store.Config{}); err == nil {
		t.Error("New without a bucket succeeded")
	}
	if _, err := s3store.New(s3store.Config{Bucket: "b", Prefix: "../x"}); err == nil {
		t.Error("New with a traversing prefix succeeded")
	}
}

// A server that is down is an error, not a NotFound: a reader must not
// take an outage for a hole.
func TestServerDownIsNotNotFound(t *testing.T) {
	st, err := s3store.New(s3store.Config{Endpoint: "http://" + s3test.FreePort(t), Bucket: "b", AccessKey: "a", SecretKey: "s"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = st.Get(ctx, "k")
	if err == nil || errors.Is(err, blockstore.ErrNotFound) {
		t.Fatalf("Get from a dead server = %v, want a non-NotFound error", err)
	}
}

// The block store over S3: a generation commits and reads back, and an
// object replaced by a flipped copy on the server is a read error.
func TestRepoOverS3(t *testing.T) {
	srv := s3test.Start(t)
	st := srv.NewStore(t, "")
	ctx := context.Background()
	nk, _, err := blockstore.GenerateNodeKey("node-a")
	if err != nil {
		t.Fatal(err)
	}
	repo, err := blockstore.New(st, nk, blockstore.Options{Compression: blockstore.CompressS2})
	if err != nil {
		t.Fatal(err)
	}
	const cs = blockstore.DefaultChunkSize
	ref := blockstore.GenRef{Volume: blockstore.Template("busybox"), Generation: 0}
	chunks := map[uint64][]byte{}
	for i := range uint64(4) {
		c := make([]byte, cs)
		rand.Read(c)
		chunks[i] = c
	}
	chunks[2] = nil
	if _, err := repo.Commit(ctx, blockstore.CommitSpec{Generation: ref, DeviceSize: 8 * cs}, chunks); err != nil {
		t.Fatal(err)
	}
	im, err := repo.Open(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, cs)
	for i := range uint64(8) {
		if err := im.ReadChunk(ctx, i, buf); err != nil {
			t.Fatalf("ReadChunk(%d): %v", i, err)
		}
		want := chunks[i]
		if want == nil {
			want = make([]byte, cs)
		}
		if !bytes.Equal(buf, want) {
			t.Fatalf("chunk %d differs", i)
		}
	}
	keys, err := st.List(ctx, ref.Volume.String()+"/chunks/")
	if err != nil || len(keys) != 3 {
		t.Fatalf("chunk objects %q, %v; want 3 (the zero chunk is a hole)", keys, err)
	}
	blob, err := st.Get(ctx, keys[0])
	if err != nil {
		t.Fatal(err)
	}
	blob[len(blob)/2] ^= 0x04
	if err := st.Delete(ctx, keys[0]); err != nil {
		t.Fatal(err)
	}
	if err := st.Put(ctx, keys[0], blob); err != nil {
		t.Fatal(err)
	}
	corrupt := 0
	for i := range uint64(4) {
		err := im.ReadChunk(ctx, i, buf)
		if err != nil && !errors.Is(err, blockstore.ErrCorrupt) {
			t.Fatalf("ReadChunk(%d): %v does not wrap ErrCorrupt", i, err)
		}
		if err != nil {
			corrupt++
		} else if chunks[i] != nil && !bytes.Equal(buf, chunks[i]) {
			t.Fatalf("chunk %d: wrong data without an error", i)
		}
	}
	if corrupt != 1 {
		t.Fatalf("%d chunks failed, want exactly the tampered one", corrupt)
	}
}

// Commit and read of a 16 MiB device of random 64 KiB chunks through
// versitygw on loopback (its posix backend on the test's temp dir): the
// S3 path's cost next to the directory store's benchmarks.
func BenchmarkRepoOverS3(b *testing.B) {
	srv := s3test.Start(b)
	st := srv.NewStore(b, "")
	ctx := context.Background()
	nk, _, _ := blockstore.GenerateNodeKey("node-a")
	repo, err := blockstore.New(st, nk, blockstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	const cs, dev = blockstore.DefaultChunkSize, 16 << 20
	data := make([]byte, dev)
	rand.Read(data)
	rounds := 0
	commit := func(b *testing.B) blockstore.GenRef {
		// A volume per round: chunks are named by content, so a second
		// round in the same volume would only dedup.
		rounds++
		ref := blockstore.GenRef{Volume: blockstore.Template(fmt.Sprintf("t%d", rounds)), Generation: 0}
		w, err := repo.NewWriter(ctx, blockstore.CommitSpec{Generation: ref, DeviceSize: dev})
		if err != nil {
			b.Fatal(err)
		}
		for c := 0; c < dev/cs; c++ {
			if err := w.WriteChunk(ctx, uint64(c), data[c*cs:(c+1)*cs]); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := w.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		return ref
	}
	b.Run("Commit", func(b *testing.B) {
		b.SetBytes(dev)
		for b.Loop() {
			commit(b)
		}
	})
	b.Run("ReadChunk", func(b *testing.B) {
		im, err := repo.Open(ctx, commit(b))
		if err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, cs)
		b.SetBytes(dev)
		for b.Loop() {
			for c := uint64(0); c < im.Chunks(); c++ {
				if err := im.ReadChunk(ctx, c, buf); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
