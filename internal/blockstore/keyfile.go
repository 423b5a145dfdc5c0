package blockstore

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ctld/ctld/internal/fsutil"
)

// LoadNodeKeyFile reads the node key id from a key file: 64 hex digits
// (surrounding white space ignored).
func LoadNodeKeyFile(path, id string) (*NodeKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("node key: %w", err)
	}
	raw, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("node key %s: not hex: %w", path, err)
	}
	return NewNodeKey(id, raw)
}

// LoadOrCreateNodeKeyFile reads the node key file, or makes it when
// missing: a new random key, 0600, O_EXCL (another process that made it
// first wins and its key is read), fsynced with its directory. The key is
// never logged.
func LoadOrCreateNodeKeyFile(path, id string) (*NodeKey, error) {
	nk, err := LoadNodeKeyFile(path, id)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return nk, err
	}
	nk, raw, err := GenerateNodeKey(id)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("node key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return LoadNodeKeyFile(path, id)
	}
	if err != nil {
		return nil, fmt.Errorf("node key: %w", err)
	}
	_, err = f.WriteString(hex.EncodeToString(raw) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fsutil.SyncDir(filepath.Dir(path))
	}
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("node key %s: %w", path, err)
	}
	return nk, nil
}
