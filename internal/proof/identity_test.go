package proof

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func fakeBootID(t *testing.T, id string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "boot_id")
	if err := os.WriteFile(p, []byte(id+"\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestIdentityCreatedOnce(t *testing.T) {
	dir := t.TempDir()
	boot := fakeBootID(t, "b3f1c2d4-0000-4000-8000-000000000001")
	first, err := loadOrCreateIdentity(dir, boot)
	if err != nil {
		t.Fatalf("create identity: %v", err)
	}
	if !nodeIDPattern.MatchString(first.NodeID) {
		t.Fatalf("node id %q does not match %v", first.NodeID, nodeIDPattern)
	}
	if first.BootID != "b3f1c2d4-0000-4000-8000-000000000001" {
		t.Fatalf("boot id = %q", first.BootID)
	}
	// A new boot keeps the node identity and key.
	second, err := loadOrCreateIdentity(dir, fakeBootID(t, "other-boot"))
	if err != nil {
		t.Fatalf("load identity: %v", err)
	}
	if second.NodeID != first.NodeID || !second.Key.Equal(first.Key) {
		t.Fatal("second load returned a different node id or key")
	}
	if second.BootID != "other-boot" {
		t.Fatalf("boot id = %q, want the current boot's", second.BootID)
	}
	st, err := os.Stat(filepath.Join(dir, "identity", "node.key"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("node.key mode = %v, want 0600", st.Mode().Perm())
	}
}

func TestIdentityConcurrentCreateAgrees(t *testing.T) {
	// Both instances may start at once on a fresh node.
	dir := t.TempDir()
	boot := fakeBootID(t, "boot")
	ids := make([]Identity, 8)
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i], errs[i] = loadOrCreateIdentity(dir, boot)
		}()
	}
	wg.Wait()
	for i := range ids {
		if errs[i] != nil {
			t.Fatalf("loader %d: %v", i, errs[i])
		}
		if ids[i].NodeID != ids[0].NodeID || !ids[i].Key.Equal(ids[0].Key) {
			t.Fatalf("loader %d got a different identity", i)
		}
	}
}

func TestIdentityRefusesReadableKey(t *testing.T) {
	dir := t.TempDir()
	boot := fakeBootID(t, "boot")
	if _, err := loadOrCreateIdentity(dir, boot); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "identity", "node.key"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadOrCreateIdentity(dir, boot); err == nil {
		t.Fatal("loaded a world-readable signing key")
	}
}

func TestIdentityRealBootID(t *testing.T) {
	if _, err := os.Stat(BootIDPath); err != nil {
		t.Skipf("no %s on this system: %v", BootIDPath, err)
	}
	id, err := LoadOrCreateIdentity(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(id.BootID) != 36 {
		t.Fatalf("boot id %q is not a UUID", id.BootID)
	}
}
