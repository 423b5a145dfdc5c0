package resource

import (
	"context"
	"errors"
	"os"
	"slices"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/proof"
	"github.com/ctld/ctld/internal/runsc"
)

// Claim is what a claim's entries share: the generation's record, and what
// earlier entries made for later ones. Each field is written by one entry
// and read by later ones (the table's order guarantees it).
type Claim struct {
	Rec    journal.Sandbox
	Lower  string       // the template directory (overlay mode)
	Root   string       // the RootFS mount point (mount, blockmount)
	NSPath string       // the netns path (netns)
	Device string       // the attached /dev/nbdX (writer, block mode)
	Binds  []runsc.Bind // the persistent volumes' host mounts (volumes)
	// staged are journal writes an entry's Make staged to commit with its
	// done record (WithDone).
	staged []func(*journal.Tx) error
}

// WithDone stages f to run in the transaction that journals the current
// entry as done: a record of what it made costs no commit of its own.
func (c *Claim) WithDone(f func(*journal.Tx) error) { c.staged = append(c.staged, f) }

// TakeStaged returns the writes staged since the last call, as one (nil
// when there are none).
func (c *Claim) TakeStaged() func(*journal.Tx) error {
	staged := c.staged
	c.staged = nil
	if len(staged) == 0 {
		return nil
	}
	return func(tx *journal.Tx) error {
		for _, f := range staged {
			if err := f(tx); err != nil {
				return err
			}
		}
		return nil
	}
}

// Liveness is an entry whose object is a sign of a ready generation's
// life. Survey reads the kernel once per reconcile (a takeover must not pay
// a runsc process or a mountinfo parse per guest) and returns the test.
type Liveness interface {
	Survey(ctx context.Context) (Missing, error)
}

// Missing says what of rec's objects is gone ("" while it exists).
type Missing func(ctx context.Context, rec journal.Sandbox) string

// SetOf is the set of ss, for a Survey's lookups.
func SetOf(ss []string) map[string]bool {
	m := make(map[string]bool, len(ss))
	for _, s := range ss {
		m[s] = true
	}
	return m
}

// NameOf is the common name of a generation's objects: its container id.
func NameOf(rec journal.Sandbox) string { return rec.ContainerID }

// Check is a proof check from a Gone result.
func Check(name string, ok bool, detail string) proof.Check {
	return proof.Check{Name: name, OK: ok, Detail: detail}
}

// PathGone is the proof check that path no longer exists.
func PathGone(name, path string) proof.Check {
	_, err := os.Lstat(path)
	state := "exists"
	switch {
	case errors.Is(err, os.ErrNotExist):
		state = "absent"
	case err != nil:
		state = err.Error()
	}
	return Check(name, errors.Is(err, os.ErrNotExist), path+" "+state)
}

// DirEntries lists dir's entries, sorted; none when dir is missing.
func DirEntries(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out, err
}
