package blockstore

import (
	"fmt"
	"strconv"
	"strings"
)

// Child returns the image of m, a generation just committed over im's
// (m.Parent is im's generation), without reading the store: im's index
// with m's entries over it. A writer that sealed its device rebases onto
// the new generation with it, so a seal costs no manifest fetches however
// long the chain has grown. im is not changed.
func (im *Image) Child(m *Manifest) (*Image, error) {
	if m.Parent == nil || *m.Parent != im.top.Ref() {
		return nil, fmt.Errorf("child of %s: %w: %s is not its child", im.top.Ref(), ErrInvalidManifest, m.Ref())
	}
	if m.ChunkSize != im.top.ChunkSize {
		return nil, fmt.Errorf("child of %s: %w: chunk size %d, not %d", im.top.Ref(), ErrInvalidManifest, m.ChunkSize, im.top.ChunkSize)
	}
	if len(im.chain) >= MaxChain {
		return nil, fmt.Errorf("child of %s: %w: parent chain longer than %d", im.top.Ref(), ErrInvalidManifest, MaxChain)
	}
	if err := m.Check(); err != nil {
		return nil, fmt.Errorf("child of %s: %w", im.top.Ref(), err)
	}
	n := m.Chunks()
	where := make(map[uint64]location, len(im.where)+len(m.Entries))
	for i, l := range im.where {
		if i < n {
			where[i] = l
		}
	}
	at := m.locations()
	for _, e := range m.Entries {
		where[e.Index] = at(e)
	}
	chain := append([]GenRef{m.Ref()}, im.chain...)
	return &Image{repo: im.repo, top: m, chain: chain, where: where}, nil
}

// ParseGenRef parses GenRef.String's form, "kind/id@generation".
func ParseGenRef(s string) (GenRef, error) {
	at := strings.LastIndexByte(s, '@')
	if at < 0 {
		return GenRef{}, fmt.Errorf("generation %q: no '@'", s)
	}
	v, err := ParseVolume(s[:at])
	if err != nil {
		return GenRef{}, fmt.Errorf("generation %q: %w", s, err)
	}
	g, err := strconv.ParseUint(s[at+1:], 10, 64)
	if err != nil {
		return GenRef{}, fmt.Errorf("generation %q: %w", s, err)
	}
	return GenRef{Volume: v, Generation: g}, nil
}
