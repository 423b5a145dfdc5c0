package blockstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ctld/ctld/internal/names"
)

// Volume names whose device a set of generations is: a sandbox's RootFS,
// a template (a template's generation 0 is the parent of the sandboxes
// made from it) or a persistent volume (a device of its own, attached to
// one sandbox at a time). Its String is the key prefix of all its objects, so a
// sandbox and a template with the same ID never share objects.
type Volume struct {
	Kind VolumeKind
	ID   string
}

// VolumeKind is sandbox, template or persistent volume.
type VolumeKind string

// The volume kinds, each the first element of its volumes' keys.
const (
	KindSandbox  VolumeKind = "sandboxes"
	KindTemplate VolumeKind = "templates"
	KindVolume   VolumeKind = "volumes"
)

// VolumeKinds lists every volume kind (GC walks them all).
var VolumeKinds = []VolumeKind{KindSandbox, KindTemplate, KindVolume}

// Sandbox is the volume of sandbox id's RootFS.
func Sandbox(id string) Volume { return Volume{Kind: KindSandbox, ID: id} }

// Template is the volume of template id.
func Template(id string) Volume { return Volume{Kind: KindTemplate, ID: id} }

// Vol is persistent volume id: its heads are its roots, as a sandbox's.
func Vol(id string) Volume { return Volume{Kind: KindVolume, ID: id} }

func (v Volume) String() string { return string(v.Kind) + "/" + v.ID }

// Check validates the volume: a known kind and an ID by the one ID rule
// (internal/names).
func (v Volume) Check() error {
	if !slices.Contains(VolumeKinds, v.Kind) {
		return fmt.Errorf("%w: volume kind %q is none of %q", ErrInvalidKey, v.Kind, VolumeKinds)
	}
	if err := names.CheckID("volume id", v.ID); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidKey, err)
	}
	return nil
}

// ParseVolume is the inverse of Volume.String.
func ParseVolume(s string) (Volume, error) {
	kind, id, ok := strings.Cut(s, "/")
	v := Volume{Kind: VolumeKind(kind), ID: id}
	if !ok {
		return v, fmt.Errorf("%w: volume %q is not <kind>/<id>", ErrInvalidKey, s)
	}
	return v, v.Check()
}

// encoder builds the deterministic big-endian encodings of headers and
// manifests: fixed-width integers and u16-length-prefixed strings.
type encoder struct{ b []byte }

func (e *encoder) raw(p []byte)  { e.b = append(e.b, p...) }
func (e *encoder) u8(v uint8)    { e.b = append(e.b, v) }
func (e *encoder) u32(v uint32)  { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64)  { e.b = binary.BigEndian.AppendUint64(e.b, v) }
func (e *encoder) bytes() []byte { return e.b }
func (e *encoder) str(s string) {
	e.b = binary.BigEndian.AppendUint16(e.b, uint16(len(s)))
	e.b = append(e.b, s...)
}

var errShort = errors.New("truncated")

// decoder reads what encoder wrote; the first short read sets err and
// every later read returns zeros, so callers check err once.
type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) raw(n int) []byte {
	if d.err != nil || n < 0 || len(d.b)-d.off < n {
		d.err = errShort
		return make([]byte, max(n, 0))
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p
}

func (d *decoder) u8() uint8   { return d.raw(1)[0] }
func (d *decoder) u32() uint32 { return binary.BigEndian.Uint32(d.raw(4)) }
func (d *decoder) u64() uint64 { return binary.BigEndian.Uint64(d.raw(8)) }
func (d *decoder) str() string {
	n := binary.BigEndian.Uint16(d.raw(2))
	return string(d.raw(int(n)))
}
func (d *decoder) rest() int { return len(d.b) - d.off }
