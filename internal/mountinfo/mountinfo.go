// Package mountinfo parses /proc/<pid>/mountinfo, the kernel's own list of
// mounts, so mount and netns code can ask "is this mounted?" from the truth
// rather than from what it remembers doing.
package mountinfo

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// SelfPath is the mount table of the calling process's mount namespace.
const SelfPath = "/proc/self/mountinfo"

// Mount is one line of mountinfo (proc(5)). Paths are unescaped.
type Mount struct {
	ID           int
	ParentID     int
	Major, Minor int
	Root         string   // root of the mount within its filesystem
	MountPoint   string   // relative to the process's root
	Options      string   // per-mount options
	Optional     []string // shared:N, master:N, ... (may be empty)
	FSType       string
	Source       string
	SuperOptions string // per-superblock options (overlay shows lowerdir= here)
}

// Parse reads mountinfo text.
func Parse(r io.Reader) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20) // overlay lines with long lowerdirs
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		m, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("parse mountinfo line %d: %w", n, err)
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return out, nil
}

// ReadFile parses the mountinfo file at path (SelfPath for this process).
func ReadFile(path string) ([]Mount, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open mountinfo: %w", err)
	}
	defer f.Close()
	return Parse(f)
}

func parseLine(line string) (Mount, error) {
	var m Mount
	f := strings.Fields(line)
	// 6 fixed fields, 0+ optional fields, "-", 3 fields after it.
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if len(f) < 10 || sep < 0 || len(f) < sep+3 {
		return m, fmt.Errorf("malformed line %q", line)
	}
	var err error
	if m.ID, err = strconv.Atoi(f[0]); err != nil {
		return m, fmt.Errorf("mount id %q: %w", f[0], err)
	}
	if m.ParentID, err = strconv.Atoi(f[1]); err != nil {
		return m, fmt.Errorf("parent id %q: %w", f[1], err)
	}
	maj, min, ok := strings.Cut(f[2], ":")
	if !ok {
		return m, fmt.Errorf("major:minor %q: no colon", f[2])
	}
	if m.Major, err = strconv.Atoi(maj); err != nil {
		return m, fmt.Errorf("major %q: %w", maj, err)
	}
	if m.Minor, err = strconv.Atoi(min); err != nil {
		return m, fmt.Errorf("minor %q: %w", min, err)
	}
	m.Root = unescape(f[3])
	m.MountPoint = unescape(f[4])
	m.Options = f[5]
	if sep > 6 {
		m.Optional = append([]string(nil), f[6:sep]...)
	}
	m.FSType = unescape(f[sep+1])
	m.Source = unescape(f[sep+2])
	if len(f) > sep+3 {
		m.SuperOptions = unescape(f[sep+3])
	}
	return m, nil
}

// unescape undoes the kernel's octal escaping of space, tab, newline and
// backslash (\040, \011, \012, \134) in mountinfo paths.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			v, _ := strconv.ParseUint(s[i+1:i+4], 8, 8)
			b.WriteByte(byte(v))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// At returns the mounts whose mount point is exactly path, in mount order
// (a later one is stacked on an earlier one).
func At(mounts []Mount, path string) []Mount {
	path = filepath.Clean(path)
	var out []Mount
	for _, m := range mounts {
		if m.MountPoint == path {
			out = append(out, m)
		}
	}
	return out
}

// Under returns the mounts at dir or anywhere below it, deepest mount
// point first, so unmounting in this order never hits a busy parent.
func Under(mounts []Mount, dir string) []Mount {
	dir = filepath.Clean(dir)
	var out []Mount
	for _, m := range mounts {
		if IsUnder(m.MountPoint, dir) {
			out = append(out, m)
		}
	}
	// Later mounts first (a stacked mount hides the one below it), then
	// deeper mount points first; the stable sort keeps the first order.
	slices.Reverse(out)
	sort.SliceStable(out, func(i, j int) bool {
		return strings.Count(out[i].MountPoint, "/") > strings.Count(out[j].MountPoint, "/")
	})
	return out
}

// IsUnder reports whether path is dir or inside it, by path components
// ("/a/bc" is not under "/a/b").
func IsUnder(path, dir string) bool {
	path, dir = filepath.Clean(path), filepath.Clean(dir)
	if path == dir {
		return true
	}
	if dir == "/" {
		return strings.HasPrefix(path, "/")
	}
	return strings.HasPrefix(path, dir+"/")
}

// Option returns the value of key=value in a comma-separated option string.
func Option(opts, key string) (string, bool) {
	for _, o := range strings.Split(opts, ",") {
		if k, v, ok := strings.Cut(o, "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}
