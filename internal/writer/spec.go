// Package writer runs the NBD writer of one block-mode generation as a
// process of its own (`ctld writer`): a copy-on-write device (cowdev) over
// the generation's base in the block store, served by nbdsrv to a kernel
// /dev/nbdX it attaches through the NBD generic-netlink family. It is not
// the primary's child in any way that matters (own session, own cgroup,
// not the guest's lease), so a kill -9 of the primary costs the guest no
// I/O error; the next primary re-adopts it from the journal.
//
// Spec and State are the contract between the primary (internal/node's
// BlockDevices, implemented by this package's Supervisor) and the process.
package writer

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/storecfg"
)

// Spec is everything one writer process needs. The primary writes it as
// JSON before starting the process; it names no secret (the node key is
// read from NodeKeyFile).
type Spec struct {
	// Sandbox and Generation name the generation the device belongs to.
	Sandbox    string `json:"sandbox"`
	Generation uint64 `json:"generation"`
	// Epoch is the writer epoch the primary journaled for this attach. A
	// writer holds its Dir's lock for its whole life, so a second writer
	// of the same sandbox is refused, and it reports Epoch in its State,
	// so a stale writer is never taken for the current one.
	Epoch uint64 `json:"epoch"`
	// StoreDir is the block store's directory (dirstore), NodeKeyFile and
	// NodeKeyID the node key that unwraps the volumes' data keys.
	StoreDir string `json:"store_dir,omitempty"`
	// Store, when its Location is set, names the block store instead of
	// StoreDir: a directory or an S3 bucket. It holds no secret: S3
	// credentials are read from its CredentialsFile or, without one, from
	// the writer's environment (Supervisor.Env).
	Store       storecfg.Config `json:"store,omitempty"`
	NodeKeyFile string          `json:"node_key_file"`
	NodeKeyID   string          `json:"node_key_id"`
	// Base is the generation the device writes over: a template's
	// generation 0 for a fresh sandbox, later the sandbox's head. A seal
	// (Supervisor.Seal) rebases the running device onto the generation it
	// committed and rewrites Dir/spec.json with it as Base; a restart
	// should name it too (one seal behind still opens: see cowdev's
	// openIndex).
	Base blockstore.GenRef `json:"base"`
	// Volume is the volume a seal commits to: zero for the sandbox's own
	// (blockstore.Sandbox(Sandbox)), a persistent volume's
	// (blockstore.Vol) for a device attached beside the root.
	Volume blockstore.Volume `json:"volume,omitzero"`
	// Dir holds the dirty file, its index, the chunk cache, the lock and
	// the state file. It outlives the process: a re-attach of the same
	// generation over the same Base finds what the last flush acknowledged.
	Dir string `json:"dir"`
	// BaseCache is the node's base cache (internal/basecache), shared by
	// the writers of every device over a template generation; empty for
	// none.
	BaseCache string `json:"base_cache,omitempty"`
	// Index is the /dev/nbdX to attach, or -1 for any free device.
	Index int `json:"index"`
	// DeadConnTimeout is how long the kernel holds I/O for a reconnect
	// after the writer's sockets died, instead of failing it.
	DeadConnTimeout time.Duration `json:"dead_conn_timeout"`
	// RequestTimeout is the kernel's per-request timeout (whole seconds;
	// 0 = DefaultRequestTimeout).
	RequestTimeout time.Duration `json:"request_timeout,omitempty"`
	// Reattach asks for the restart of a dead writer under a mounted
	// filesystem: the device the Dir's dead writer left configured (its
	// state file names it) must be handed a fresh socket. If that cannot
	// be done the writer exits with ErrNoReattach and touches neither
	// the device nor the dead writer's state: it never disconnects it
	// (the guest's filesystem is on it) nor attaches another.
	Reattach bool `json:"reattach,omitempty"`
}

// State is what a running writer reports (its state file in Spec.Dir,
// replaced atomically): enough for a primary to adopt it after a crash and
// to tell it from a stale one.
type State struct {
	PID int `json:"pid"`
	// StartTime is the process's start time in clock ticks since boot
	// (/proc/PID/stat field 22): with PID it names the process across PID
	// reuse.
	StartTime uint64 `json:"start_time"`
	Epoch     uint64 `json:"epoch"`
	// Index is the attached /dev/nbdX; Device its path.
	Index  int    `json:"index"`
	Device string `json:"device"`
	// Size is the device size in bytes: the generation's disk lease.
	Size int64 `json:"size"`
	// DevicePID is what /sys/block/nbdX/pid shows while the device is
	// configured: the pid of the writer that connected it. A device whose
	// pid file still names it after the writer died is this Dir's, and is
	// disconnected before a new writer attaches.
	DevicePID int `json:"device_pid"`
}

// Files in Spec.Dir besides cowdev's (dirty, index, cache, seal) and
// CtlName.
const (
	SpecName  = "spec.json"  // the spec the primary wrote for the last Start
	StateName = "state.json" // the running writer's State
	LockName  = "lock"       // flocked by the writer for its whole life
	LogName   = "writer.log" // the writer's stderr (slog text), appended
)

// The writer's log is bounded (issue 21): a guest's failing I/O or a
// broken bucket makes a line per request, so lines of one kind pass at
// most LogBurst times per LogEvery (then one "suppressed similar lines"
// summary), and the file is capped at LogMax (its older half in
// writer.log.1), like the guests' logs.
const (
	LogMax   = 1 << 20
	LogBurst = 20
	LogEvery = time.Minute
)

// DefaultRequestTimeout is the kernel's per-request timeout when the spec
// names none. On 6.1 a request that times out marks the socket dead, so
// it must exceed the slowest store fetch a request can wait for.
const DefaultRequestTimeout = 2 * time.Minute

// ErrInvalidSpec marks a spec refused before anything was touched.
var ErrInvalidSpec = errors.New("invalid writer spec")

// Check validates the spec (and fills in the default request timeout).
func (s *Spec) Check() error {
	if s.RequestTimeout == 0 {
		s.RequestTimeout = DefaultRequestTimeout
	}
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrInvalidSpec}, a...)...) }
	switch {
	case s.Sandbox == "":
		return bad("no sandbox")
	case s.Epoch == 0:
		return bad("epoch 0 (epochs start at 1)")
	case s.Store.Location == "" && !filepath.IsAbs(s.StoreDir):
		return bad("store dir %q is not absolute", s.StoreDir)
	case !filepath.IsAbs(s.NodeKeyFile):
		return bad("node key file %q is not absolute", s.NodeKeyFile)
	case !filepath.IsAbs(s.Dir) || filepath.Clean(s.Dir) != s.Dir || s.Dir == "/":
		return bad("dir %q is not a clean absolute path", s.Dir)
	case s.Index < -1:
		return bad("index %d", s.Index)
	case s.Reattach && s.Index < 0:
		return bad("a re-attach names the device (index %d)", s.Index)
	case s.DeadConnTimeout < 0 || s.DeadConnTimeout%time.Second != 0:
		return bad("dead-connection timeout %v is not whole seconds", s.DeadConnTimeout)
	case s.RequestTimeout < time.Second || s.RequestTimeout%time.Second != 0:
		return bad("request timeout %v is not whole seconds >= 1s", s.RequestTimeout)
	}
	if s.Store.Location != "" {
		if err := s.Store.Check(); err != nil {
			return bad("store: %v", err)
		}
	}
	if err := blockstore.CheckKeyID(s.NodeKeyID); err != nil {
		return bad("node key id: %v", err)
	}
	if err := s.Base.Volume.Check(); err != nil {
		return bad("base: %v", err)
	}
	if err := s.SealVolume().Check(); err != nil {
		return bad("volume: %v", err)
	}
	return nil
}

// SealVolume is the volume a seal of the device commits to.
func (s *Spec) SealVolume() blockstore.Volume {
	if s.Volume != (blockstore.Volume{}) {
		return s.Volume
	}
	return blockstore.Sandbox(s.Sandbox)
}
