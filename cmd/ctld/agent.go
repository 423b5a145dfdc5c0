package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/ctld/ctld/internal/fsutil"
)

// defaultAgentBinary is ctl-agent beside the running ctld (make install
// and the packages put both in one directory).
func defaultAgentBinary() string {
	exe, err := os.Executable()
	if err != nil {
		return "ctl-agent"
	}
	return filepath.Join(filepath.Dir(exe), "ctl-agent")
}

// checkAgentBinary refuses what cannot run as a guest's init in any image:
// a missing file, a non-executable one, anything but a static ELF (a
// dynamic one needs the image's libc).
func checkAgentBinary(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("the guest agent binary: %w (build it with `make agent`)", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("the guest agent binary %s is not an executable file (mode %v)", p, fi.Mode())
	}
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("the guest agent binary %s: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("the guest agent binary %s is dynamically linked: build it static (CGO_ENABLED=0, `make agent`)", p)
		}
	}
	return nil
}

// stageAgent copies the agent binary to <runDir>/agent/ctl-agent (root
// only), so each generation's copy is a hard link on the same tmpfs, and
// a binary replaced on disk reaches new generations at the next term
// only. "" stages nothing: claims are then refused.
func stageAgent(src, runDir string) (string, error) {
	if src == "" {
		return "", nil
	}
	dir := filepath.Join(runDir, "agent")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("stage the guest agent: %w", err)
	}
	in, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("stage the guest agent: %w", err)
	}
	defer in.Close()
	b, err := io.ReadAll(io.LimitReader(in, 256<<20))
	if err != nil {
		return "", fmt.Errorf("stage the guest agent: %w", err)
	}
	if len(b) == 256<<20 {
		return "", errors.New("stage the guest agent: binary larger than 256 MiB")
	}
	dst := filepath.Join(dir, "ctl-agent")
	if err := fsutil.WriteFileAtomic(dst, b, 0o755); err != nil {
		return "", fmt.Errorf("stage the guest agent: %w", err)
	}
	return dst, nil
}
