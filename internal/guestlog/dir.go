package guestlog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Dirs are the log directories of generations under one root (ctld's
// <run>/runsc.logs). Container ids are validated by the caller: they
// become path elements.
type Dirs struct {
	Root string
}

// Dir is the log directory of container id.
func (d Dirs) Dir(id string) string { return filepath.Join(d.Root, id) }

// legacy are the files of id that ctld before per-generation log
// directories wrote straight into Root; they are removed with the
// directory so an upgraded node does not keep its old leak.
func (d Dirs) legacy(id string) []string {
	return []string{
		filepath.Join(d.Root, id+".log"),
		filepath.Join(d.Root, id+".init.log"),
		filepath.Join(d.Root, id+".debug"),
	}
}

// Make creates the log directory of id (idempotent).
func (d Dirs) Make(id string) error {
	if err := os.MkdirAll(d.Root, 0o700); err != nil {
		return fmt.Errorf("make log root: %w", err)
	}
	if err := os.Mkdir(d.Dir(id), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("make log dir: %w", err)
	}
	return nil
}

// Remove removes every log file of id; already gone is success.
func (d Dirs) Remove(id string) error {
	var errs []error
	for _, p := range append([]string{d.Dir(id)}, d.legacy(id)...) {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("remove log %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// CheckGone proves no log file of id is left. detail says what is left,
// or what was checked.
func (d Dirs) CheckGone(id string) (bool, string) {
	var left []string
	for _, p := range append([]string{d.Dir(id)}, d.legacy(id)...) {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, p)
		} else if !errors.Is(err, os.ErrNotExist) {
			left = append(left, fmt.Sprintf("%s (%v)", p, err))
		}
	}
	if len(left) > 0 {
		return false, "left: " + strings.Join(left, ", ")
	}
	return true, d.Dir(id) + " absent"
}

// List returns the container ids that have log files under Root (a
// directory, or legacy files), sorted. valid filters names that are not
// container ids (runsc's own runsc.log for commands about no container).
func (d Dirs) List(valid func(string) bool) ([]string, error) {
	ents, err := os.ReadDir(d.Root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list logs: %w", err)
	}
	var out []string
	for _, e := range ents {
		id := e.Name()
		if !e.IsDir() || strings.HasSuffix(id, ".debug") {
			for _, suf := range []string{".init.log", ".log", ".debug"} {
				if s, ok := strings.CutSuffix(id, suf); ok {
					id = s
					break
				}
			}
		}
		if valid(id) && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out, nil
}
