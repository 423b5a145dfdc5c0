package blockstore

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ctld/ctld/internal/fsutil"
)

// LoadNodeKeyFile reads the node key id from a key file: 64 hex digits
// (surrounding white space ignored), in a file of mode 0600
// (fsutil.ReadPrivate: a key others can read unwraps every data key).
func LoadNodeKeyFile(path, id string) (*NodeKey, error) {
	b, err := fsutil.ReadPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("node key: %w", err)
	}
	return parseNodeKey(path, id, b)
}

func parseNodeKey(path, id string, b []byte) (*NodeKey, error) {
	raw, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("node key %s: not hex: %w", path, err)
	}
	return NewNodeKey(id, raw)
}

// LoadOrCreateNodeKeyFile reads the node key file, or makes it when
// missing: a new random key, written complete or not at all (temp file,
// fsync, link into place, fsync the dir: fsutil.LoadOrCreate, as the
// proof key), mode 0600; another process that made it first wins and its
// key is read. The key is never logged.
func LoadOrCreateNodeKeyFile(path, id string) (*NodeKey, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("node key: %w", err)
	}
	b, err := fsutil.LoadOrCreate(path, 0o600, fsutil.ReadPrivate, func() ([]byte, error) {
		_, raw, err := GenerateNodeKey(id)
		if err != nil {
			return nil, err
		}
		return []byte(hex.EncodeToString(raw) + "\n"), nil
	})
	if err != nil {
		return nil, fmt.Errorf("node key: %w", err)
	}
	return parseNodeKey(path, id, b)
}
