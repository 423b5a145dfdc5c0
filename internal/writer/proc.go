package writer

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// procStat returns a process's state letter and start time (clock ticks
// since boot, field 22 of /proc/PID/stat).
func procStat(procRoot string, pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, err
	}
	start, err = ParseStartTime(b)
	if err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/%w", pid, err)
	}
	// comm (field 2) may hold spaces and parentheses: field 3 follows the last ')'.
	return b[strings.LastIndexByte(string(b), ')')+2], start, nil
}

// alive reports whether pid is still the process that started at start
// (PID reuse gives another start time); a zombie is not alive.
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	st, s, err := procStat("/proc", pid)
	return err == nil && s == start && st != 'Z' && st != 'X'
}

// dying reports whether pid is exiting: a zombie, or gone (a pid
// read from /proc/locks a moment ago).
func dying(pid int) bool {
	st, _, err := procStat("/proc", pid)
	return err != nil || st == 'Z' || st == 'X'
}

// lockHolder returns the pid of the process holding an exclusive flock on
// path according to /proc/locks (0 if none). Reading /proc/locks, unlike
// trying the lock, cannot disturb a writer that is just starting.
func lockHolder(path string) (int, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, nil
		}
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	f, err := os.Open("/proc/locks")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; blocked
		// waiters show as "1: -> FLOCK ..." and are skipped.
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 || fs[1] != "FLOCK" || fs[3] != "WRITE" || fs[5] != want {
			continue
		}
		pid, err := strconv.Atoi(fs[4])
		if err != nil {
			return 0, fmt.Errorf("/proc/locks: %q: %w", sc.Text(), err)
		}
		return pid, nil
	}
	return 0, sc.Err()
}

// readState reads Dir/state.json.
func readState(dir string) (State, error) {
	var s State
	b, err := os.ReadFile(filepath.Join(dir, StateName))
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("writer state %s: %w", filepath.Join(dir, StateName), err)
	}
	return s, nil
}

// readSpec reads a spec file.
func readSpec(path string) (Spec, error) {
	var s Spec
	b, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%w: %s: %v", ErrInvalidSpec, path, err)
	}
	return s, nil
}

// writeFileAtomic replaces path by temp + fsync + rename + dir fsync, so
// a reader sees the old or the new content, never a torn one.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return syncDir(dir)
}

// removeDurable removes path (absent is fine) and fsyncs its directory;
// a directory that is gone too is fine (a Stop repeated after the writer
// dir was removed: teardown is idempotent).
func removeDurable(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := syncDir(filepath.Dir(path)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

// devicePID reads /sys/block/nbdX/pid: the pid of the process that
// connected the device, 0 when no config is held.
func devicePID(sysRoot string, index int) (int, error) {
	b, err := os.ReadFile(filepath.Join(sysRoot, "nbd"+strconv.Itoa(index), "pid"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// ParseStartTime returns field 22 (start time) of a /proc/PID/stat line;
// comm (field 2) may hold spaces and parentheses, so fields 3.. are
// counted from the last ')'.
func ParseStartTime(stat []byte) (uint64, error) {
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return 0, errors.New("stat: no ')'")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("stat: %d fields after comm", len(f))
	}
	return strconv.ParseUint(f[19], 10, 64)
}
