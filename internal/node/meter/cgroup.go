// Package meter measures what each runtime generation uses (issue 22 §2)
// and journals it as the metering stream: a record per live generation
// at a fixed interval and a final one when its teardown starts, before
// anything of it is removed (so before its capacity can come back). The
// kernel is read here: the lease cgroup's files, the generation's nft
// counters and its disk project, through what the node passes in.
package meter

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Cgroup is what a lease's cgroup files say, as totals of the generation.
type Cgroup struct {
	CPUUsec            uint64 // cpu.stat usage_usec
	MemoryCurrentBytes uint64 // memory.current
	MemoryPeakBytes    uint64 // memory.peak (0: the kernel has none)
	PIDsPeak           uint64 // pids.peak (0: the kernel has none)
	IOReadBytes        uint64 // io.stat rbytes, summed over devices
	IOWriteBytes       uint64 // io.stat wbytes, summed over devices
}

// maxCgroupFile bounds one read: these files are a few lines.
const maxCgroupFile = 64 << 10

// ReadCgroup reads the cgroup v2 directory dir. A missing cpu.stat is an
// error wrapping fs.ErrNotExist (the lease is gone); a missing peak or
// io.stat file is a kernel without it and reads as zero.
func ReadCgroup(dir string) (Cgroup, error) {
	var c Cgroup
	if dir == "" {
		return c, fmt.Errorf("read cgroup: no directory: %w", fs.ErrNotExist)
	}
	cpu, err := readFile(dir, "cpu.stat")
	if err != nil {
		return c, err
	}
	kv, err := parseFlatKeyed(cpu)
	if err != nil {
		return c, fmt.Errorf("read cgroup %s: cpu.stat: %w", dir, err)
	}
	c.CPUUsec = kv["usage_usec"]
	for _, f := range []struct {
		name string
		v    *uint64
	}{{"memory.current", &c.MemoryCurrentBytes}, {"memory.peak", &c.MemoryPeakBytes}, {"pids.peak", &c.PIDsPeak}} {
		b, err := readFile(dir, f.name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		} else if err != nil {
			return c, err
		}
		if *f.v, err = parseSingle(b); err != nil {
			return c, fmt.Errorf("read cgroup %s: %s: %w", dir, f.name, err)
		}
	}
	ios, err := readFile(dir, "io.stat")
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	} else if err != nil {
		return c, err
	}
	if c.IOReadBytes, c.IOWriteBytes, err = parseIOStat(ios); err != nil {
		return c, fmt.Errorf("read cgroup %s: io.stat: %w", dir, err)
	}
	return c, nil
}

func readFile(dir, name string) ([]byte, error) {
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return nil, fmt.Errorf("read cgroup file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCgroupFile+1))
	if err != nil {
		return nil, fmt.Errorf("read cgroup file %s: %w", f.Name(), err)
	}
	if len(b) > maxCgroupFile {
		return nil, fmt.Errorf("read cgroup file %s: longer than %d bytes", f.Name(), maxCgroupFile)
	}
	return b, nil
}

// parseSingle reads a one-value file ("123\n"; "max" is not a usage).
func parseSingle(b []byte) (uint64, error) {
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// parseFlatKeyed reads "key value" lines (cpu.stat).
func parseFlatKeyed(b []byte) (map[string]uint64, error) {
	out := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return nil, fmt.Errorf("bad line %q", sc.Text())
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bad line %q: %w", sc.Text(), err)
		}
		out[f[0]] = v
	}
	return out, sc.Err()
}

// parseIOStat sums rbytes and wbytes of io.stat's lines
// ("MAJ:MIN rbytes=N wbytes=N rios=N ...").
func parseIOStat(b []byte) (r, w uint64, err error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		for _, kv := range f[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return 0, 0, fmt.Errorf("bad field %q", kv)
			}
			if k != "rbytes" && k != "wbytes" {
				continue
			}
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("bad field %q: %w", kv, err)
			}
			if k == "rbytes" {
				r += n
			} else {
				w += n
			}
		}
	}
	return r, w, sc.Err()
}
