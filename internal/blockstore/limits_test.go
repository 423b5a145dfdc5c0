package blockstore

import "testing"

// TestMaxObjectSize: each kind of key gets its kind's limit; a key of no
// known kind gets the largest.
func TestMaxObjectSize(t *testing.T) {
	v := Sandbox("sb")
	for key, want := range map[string]int64{
		chunkKey(v, [32]byte{1}):                  MaxChunkObject,
		manifestKey(GenRef{Volume: v}):            MaxManifestObject,
		headKey(v, 1):                             MaxSmallObject,
		snapshotKey(v, "s"):                       MaxSmallObject,
		tombstoneKey(v):                           MaxSmallObject,
		keyObject(Vol("data")):                    MaxSmallObject,
		"other/thing":                             MaxManifestObject,
		"templates/busybox/unknown/kind/of/thing": MaxManifestObject,
	} {
		if got := MaxObjectSize(key); got != want {
			t.Errorf("MaxObjectSize(%q) = %d, want %d", key, got, want)
		}
	}
	// A sealed chunk of the largest chunk size fits.
	if MaxChunkObject < MaxChunkSize+512 {
		t.Errorf("MaxChunkObject %d leaves no room for a sealed %d-byte chunk's header", MaxChunkObject, MaxChunkSize)
	}
}
