package blockstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
)

// BenchmarkForkDeviceSize forks a generation with the same 4 MiB of data
// on a 1 GiB and on a 16 GiB device: a fork writes one manifest with no
// entries, so the two should cost the same (compare the ns/op of the two
// sub-benchmarks; the ratio is the goal's "fork time vs device size").
func BenchmarkForkDeviceSize(b *testing.B) {
	for _, size := range []uint64{1 << 30, 16 << 30} {
		b.Run(fmt.Sprintf("%dGiB", size>>30), func(b *testing.B) {
			ctx := context.Background()
			r := benchRepo(b, blockstore.CompressNone)
			src := blockstore.GenRef{Volume: blockstore.Sandbox("src"), Generation: 1}
			chunks := map[uint64][]byte{}
			data := benchData(b)[:4<<20]
			for i := range uint64(len(data) / blockstore.DefaultChunkSize) {
				// Spread over the device: the index the fork opens covers it all.
				chunks[i*(size/blockstore.DefaultChunkSize/64)] = data[i*blockstore.DefaultChunkSize : (i+1)*blockstore.DefaultChunkSize]
			}
			if _, err := r.Commit(ctx, blockstore.CommitSpec{Generation: src, DeviceSize: size}, chunks); err != nil {
				b.Fatal(err)
			}
			for i := 0; b.Loop(); i++ {
				if _, err := r.Fork(ctx, src, blockstore.Sandbox(fmt.Sprintf("dst-%d", i))); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
