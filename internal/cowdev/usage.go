package cowdev

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// DirtyBytes is the disk the dirty file in dir takes on the node: its
// allocated blocks. That is the chunks the device's writer wrote (whole
// chunks; a trimmed or zeroed chunk is a hole again) and the copies a
// seal keeps of chunks it committed, since the dir was first opened:
// the generation's own data, not its base's, nor the chunk cache. One
// stat, safe beside the running writer. A dir without a dirty file is an
// error wrapping fs.ErrNotExist.
func DirtyBytes(dir string) (uint64, error) {
	fi, err := os.Stat(filepath.Join(dir, dirtyName))
	if err != nil {
		return 0, fmt.Errorf("dirty file: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, errors.New("dirty file: no block count")
	}
	return uint64(st.Blocks) * 512, nil // st_blocks counts 512-byte units
}
