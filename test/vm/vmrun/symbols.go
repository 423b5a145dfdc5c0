package main

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// symtab maps kernel text addresses to function names from the kernel
// package's System.map, so qemu's view of a hung vCPU (its RIP) reads as a
// function even when the guest cannot print its own backtrace. The guest
// boots with nokaslr, so the addresses match the map.
type symtab struct {
	addrs []uint64
	names []string
}

func loadSymtab(path string) (symtab, error) {
	f, err := os.Open(path)
	if err != nil {
		return symtab{}, fmt.Errorf("open kernel symbols: %w", err)
	}
	defer f.Close()
	var s symtab
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 3 || !strings.ContainsAny(fs[1], "tTwW") {
			continue
		}
		a, err := strconv.ParseUint(fs[0], 16, 64)
		if err != nil {
			continue
		}
		s.addrs = append(s.addrs, a)
		s.names = append(s.names, fs[2])
	}
	if err := sc.Err(); err != nil {
		return symtab{}, fmt.Errorf("read kernel symbols %s: %w", path, err)
	}
	// System.map is sorted, but do not rely on it.
	idx := make([]int, len(s.addrs))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(i, j int) bool { return s.addrs[idx[i]] < s.addrs[idx[j]] })
	out := symtab{addrs: make([]uint64, len(idx)), names: make([]string, len(idx))}
	for i, k := range idx {
		out.addrs[i], out.names[i] = s.addrs[k], s.names[k]
	}
	return out, nil
}

// lookup names the function that holds addr, as name+0xoffset.
func (s symtab) lookup(addr uint64) string {
	i := sort.Search(len(s.addrs), func(i int) bool { return s.addrs[i] > addr }) - 1
	if i < 0 {
		return "?"
	}
	return fmt.Sprintf("%s+0x%x", s.names[i], addr-s.addrs[i])
}

var (
	cpuLineRE = regexp.MustCompile(`^CPU#(\d+)`)
	ripRE     = regexp.MustCompile(`RIP=([0-9a-f]{16})`)
	hltRE     = regexp.MustCompile(`HLT=(\d)`)
)

// vcpuSummary turns `info registers -a` into one line per vCPU: where it
// executes and whether it is halted (idle).
func vcpuSummary(regs string, syms symtab) []string {
	var out []string
	cpu := ""
	for _, l := range strings.Split(regs, "\n") {
		l = strings.TrimSpace(l)
		if m := cpuLineRE.FindStringSubmatch(l); m != nil {
			cpu = m[1]
			continue
		}
		m := ripRE.FindStringSubmatch(l)
		if m == nil || cpu == "" {
			continue
		}
		a, _ := strconv.ParseUint(m[1], 16, 64)
		state := "running"
		if h := hltRE.FindStringSubmatch(l); h != nil && h[1] == "1" {
			state = "halted"
		}
		out = append(out, fmt.Sprintf("vCPU %s %s at %s (%s)", cpu, state, m[1], syms.lookup(a)))
		cpu = ""
	}
	return out
}
