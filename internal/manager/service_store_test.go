package manager

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
)

type lockedClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *lockedClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func openServiceStore(t *testing.T) (*Store, *lockedClock, string) {
	t.Helper()
	clk := &lockedClock{t: time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "manager.db")
	s, err := OpenStore(context.Background(), path, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, clk, path
}

func TestKeysStoreOnlyHashes(t *testing.T) {
	ctx := context.Background()
	s, _, path := openServiceStore(t)
	if _, _, err := s.CreateKey(ctx, "nobody"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("key for an unknown owner: %v, want not_found", err)
	}
	if _, err := s.CreateOwner(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	key, rec, err := s.CreateKey(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, "ctl_") || len(key) != 47 || !strings.HasPrefix(key[4:], rec.KeyID) {
		t.Fatalf("key %q (id %q): want ctl_ + 43 base64url characters starting with the id", key, rec.KeyID)
	}
	if owner, err := s.Authenticate(ctx, key); err != nil || owner != "team-a" {
		t.Fatalf("Authenticate = %q, %v", owner, err)
	}
	// Same id prefix, different secret: refused.
	last := byte('A')
	if key[len(key)-1] == 'A' {
		last = 'B'
	}
	forged := key[:len(key)-1] + string(last)
	for _, bad := range []string{"", "ctl_", "Bearer " + key, forged, key + "x", strings.ToUpper(key)} {
		if _, err := s.Authenticate(ctx, bad); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("Authenticate(%q) = %v, want unauthenticated", bad, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{path, path + "-wal"} {
		b, err := os.ReadFile(f)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if strings.Contains(string(b), key) || strings.Contains(string(b), key[len("ctl_")+keyIDLen:]) {
			t.Fatalf("%s holds the key's secret", f)
		}
	}
	s2, err := OpenStore(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.RevokeKey(ctx, rec.KeyID); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Authenticate(ctx, key); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("revoked key: %v", err)
	}
	keys, err := s2.Keys(ctx, "team-a")
	if err != nil || len(keys) != 1 || keys[0].RevokedAt == nil {
		t.Fatalf("Keys = %+v, %v", keys, err)
	}
}
