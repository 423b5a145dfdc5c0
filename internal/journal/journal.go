// Package journal is ctld's durable record of intent (bbolt in the state
// dir). Every kernel effect is written as *intended* before it is made and
// *done* after, each with the epoch of the primary that wrote it; sandbox
// records, operation results (for idempotency across failover), cleanup
// proofs and withheld capacity live beside them. The journal says what ctld
// meant to do; the kernel decides what exists (see the reconciler). The
// records are the journal's own versioned types (RecordVersion), not the
// API's: a change on the wire never changes what is on disk.
package journal

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync/atomic"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/proof"
	bolt "go.etcd.io/bbolt"
)

var (
	bucketEffects    = []byte("effects")
	bucketSandboxes  = []byte("sandboxes")
	bucketOperations = []byte("operations")
	bucketProofs     = []byte("proofs")
)

// RecordVersion is the version of the records this package writes, in
// each record's "record_version". Version 0 is the encoding before the
// journal had record types of its own (the API's JSON of the time): the
// same members, without "record_version", so it decodes as is. A record of
// a newer version is refused rather than half read.
const RecordVersion = 1

// Kind is a kind of kernel object ctld makes, one per entry of the
// generation's resource table.
type Kind string

// Effect kinds.
const (
	KindCgroup Kind = "cgroup"
	KindMount  Kind = "mount"
	KindNetns  Kind = "netns"
	KindBundle Kind = "bundle"
	KindRunsc  Kind = "runsc"
	// KindLogs is a generation's log directory (guestlog): made first,
	// removed last, after the lease cgroup (and the log writer in it).
	KindLogs Kind = "logs"
	KindDisk Kind = "disk" // the project quota that bounds a generation's scratch dir
	// The sandbox network (docs/network-design.md §5), each named by the
	// generation's address slot (Sandbox.Slot).
	KindLinks     Kind = "links"     // the veth pair and its addresses and routes
	KindNft       Kind = "nft"       // the generation's objects in the nft table
	KindDNS       Kind = "dns"       // the DNS proxy's registry entry (memory)
	KindConntrack Kind = "conntrack" // the conntrack entries marked with the slot
	// Block mode (rootfs.mode = block): the writer process and its
	// /dev/nbdX, and the device's filesystem mounted as the OCI root.
	KindWriter     Kind = "writer"
	KindBlockMount Kind = "blockmount"
	// KindAgent is the guest agent's host side: the generation's directory
	// holding the agent binary (bound read-only into the guest) and the
	// socket directory (bound read-write; the agent listens there).
	KindAgent Kind = "agent"
	// KindVolumes are the generation's persistent volumes: per volume a
	// writer process with its /dev/nbdX and the device's filesystem
	// mounted on the host, bound into the guest (Sandbox.Volumes).
	KindVolumes Kind = "volumes"
)

// EffectState is where an effect is in its life.
type EffectState string

// Effect states.
const (
	Intended EffectState = "intended"
	Done     EffectState = "done"
	Removing EffectState = "removing"
)

// Effect is one kernel object ctld made or is about to make.
type Effect struct {
	RecordVersion int         `json:"record_version,omitempty"`
	Kind          Kind        `json:"kind"`
	Name          string      `json:"name"`
	SandboxID     string      `json:"sandbox_id"`
	Generation    uint64      `json:"generation"`
	State         EffectState `json:"state"`
	Epoch         uint64      `json:"epoch"`
	Updated       time.Time   `json:"updated"`
	// Slot is the generation's address slot, so an effect record outlives
	// a sandbox record that moved on to a newer generation and still
	// names its network objects (0: none).
	Slot uint32 `json:"slot,omitempty"`
}

func effectKey(kind Kind, name string) []byte { return []byte(string(kind) + "/" + name) }

func (e Effect) key() []byte { return effectKey(e.Kind, e.Name) }

// State is the state of a sandbox's current generation. The values are the
// API's (node converts), but they are the journal's own: a rename on the
// wire does not rename what the journal holds.
type State string

// Sandbox states.
const (
	StateClaiming  State = "claiming"
	StateReady     State = "ready"
	StateReleasing State = "releasing"
	StateReleased  State = "released"
	StateFailed    State = "failed"
	StateLost      State = "lost"
	// StateExited: the guest's main process (or the guest itself) ended;
	// the generation still holds its objects and capacity until a release
	// (Sandbox.Exit says how it ended).
	StateExited State = "exited"
)

// ExitKind tells how a generation's guest ended.
type ExitKind string

// Exit kinds.
const (
	ExitNormal ExitKind = "exit"  // the workload exited; Code is its status
	ExitOOM    ExitKind = "oom"   // the lease's memory.max killed the guest
	ExitCrash  ExitKind = "crash" // the guest (sentry, gofer) died without its agent's report
)

// ExitRecord is how and when a generation's guest ended, journaled the
// moment a primary saw it.
type ExitRecord struct {
	Kind ExitKind `json:"kind"`
	// Code is the workload's exit status (128+n when signal n ended it);
	// -1 when the guest left no report (oom, crash).
	Code int `json:"code"`
	// At is when the primary saw the exit; SeenBy the epoch that saw it
	// (a later epoch than the generation's: it ended while no primary
	// watched, or during a failover).
	At       time.Time `json:"at"`
	SeenBy   uint64    `json:"seen_by"`
	OOMKills int64     `json:"oom_kills,omitempty"`
	Detail   string    `json:"detail,omitempty"`
}

// OnExit values of a claim: what the node does when the guest ends.
const (
	OnExitKeep    = "keep"    // journal the exit; the generation waits for a release
	OnExitRelease = "release" // journal the exit, then release it with a proof
)

// Resources of a generation, as claimed.
type Resources struct {
	CPUMillis   int64  `json:"cpu_millis"`
	MemoryBytes int64  `json:"memory_bytes"`
	PIDs        int64  `json:"pids"`
	Cpuset      string `json:"cpuset,omitempty"`
	DiskBytes   int64  `json:"disk_bytes,omitempty"`
}

// RootFSMode is where a RootFS's blocks live.
type RootFSMode string

// RootFS modes.
const (
	RootFSOverlay RootFSMode = "overlay"
	RootFSBlock   RootFSMode = "block"
)

// RootFS of a generation: its mode and template.
type RootFS struct {
	Mode     RootFSMode `json:"mode"`
	Template string     `json:"template"`
	// ExpectHead is the claim's lower bound on the sandbox volume's head.
	ExpectHead VolumeHead `json:"expect_head,omitzero"`
	// WriterEpoch is the fleet's writer epoch of the generation (0: the
	// node's own; api.RootFS.WriterEpoch).
	WriterEpoch uint64 `json:"writer_epoch,omitempty"`
}

// NetworkMode is a generation's network mode.
type NetworkMode string

// NetworkPolicy of a generation.
type NetworkPolicy struct {
	Mode  NetworkMode   `json:"mode"`
	Rules []NetworkRule `json:"rules,omitempty"`
}

// NetworkRule allows one destination (a CIDR or a domain), by protocol and
// ports.
type NetworkRule struct {
	CIDR     string   `json:"cidr,omitempty"`
	Domain   string   `json:"domain,omitempty"`
	Protocol string   `json:"protocol,omitempty"`
	Ports    []string `json:"ports,omitempty"`
}

// Process is a generation's main process.
type Process struct {
	Args []string `json:"args,omitempty"`
	Env  []string `json:"env,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	UID  uint32   `json:"uid,omitempty"`
	GID  uint32   `json:"gid,omitempty"`
	// UserSet: the claim names UID and GID (root too), so the template
	// image's user does not apply (node's image defaults).
	UserSet bool `json:"user_set,omitempty"`
}

// ClaimRequest is the claim as admitted: what a new primary needs to
// finish or redo it.
type ClaimRequest struct {
	OperationID    string        `json:"operation_id"`
	Generation     uint64        `json:"generation"`
	RootFS         RootFS        `json:"rootfs"`
	Resources      Resources     `json:"resources"`
	Network        NetworkPolicy `json:"network"`
	Process        Process       `json:"process"`
	MaxLifetimeSec int64         `json:"max_lifetime_sec,omitempty"`
	Volumes        []VolumeMount `json:"volumes,omitempty"`
	// OnExit is OnExitKeep (also when empty) or OnExitRelease.
	OnExit string `json:"on_exit,omitempty"`
}

// VolumeMount is a claim's persistent volume ID, mounted at Path in the
// guest.
type VolumeMount struct {
	ID   string `json:"id"`
	Path string `json:"path"`
	// ExpectHead is the claim's lower bound on the volume's head.
	ExpectHead VolumeHead `json:"expect_head,omitzero"`
}

// Timings of a claim's steps, in milliseconds.
type Timings struct {
	AdmitMS   float64 `json:"admit_ms"`
	LeaseMS   float64 `json:"lease_ms"`
	RootFSMS  float64 `json:"rootfs_ms"`
	NetworkMS float64 `json:"network_ms"`
	RunscMS   float64 `json:"runsc_ms"`
	ProofMS   float64 `json:"proof_ms"`
	TotalMS   float64 `json:"total_ms"`
	// Steps is each resource's make time, in claim order.
	Steps []StepTiming `json:"steps,omitempty"`
}

// StepTiming is one resource's share of a claim or a release, in
// milliseconds.
type StepTiming struct {
	Resource string  `json:"resource"`
	MakeMS   float64 `json:"make_ms,omitempty"`
	RemoveMS float64 `json:"remove_ms,omitempty"`
	CheckMS  float64 `json:"check_ms,omitempty"`
}

// ReleaseTimings of the teardown that ended a generation, in milliseconds.
type ReleaseTimings struct {
	Steps   []StepTiming `json:"steps"`
	ProofMS float64      `json:"proof_ms"`
	TotalMS float64      `json:"total_ms"`
}

// Sandbox is the node's record of a sandbox and its current generation.
type Sandbox struct {
	RecordVersion int       `json:"record_version,omitempty"`
	ID            string    `json:"id"`
	Generation    uint64    `json:"generation"`
	State         State     `json:"state"`
	ContainerID   string    `json:"container_id,omitempty"`
	LeaseID       string    `json:"lease_id,omitempty"`
	Resources     Resources `json:"resources"`
	// RuntimePIDs is the node's allowance for the runtime's own tasks
	// (the sentry's and gofer's threads, ptrace's stubs) that the lease's
	// pids.max holds on top of Resources.PIDs, the workload's. Kept with
	// the generation so the ledger counts what each lease really got, also
	// after the node's setting changed.
	RuntimePIDs int64     `json:"runtime_pids,omitempty"`
	RootFS      RootFS    `json:"rootfs"`
	Epoch       uint64    `json:"epoch"`
	CreatedAt   time.Time `json:"created_at"`
	Timings     Timings   `json:"timings"`
	// ReleaseTimings is set once a teardown of this generation ran.
	ReleaseTimings *ReleaseTimings `json:"release_timings,omitempty"`
	Reason         string          `json:"reason,omitempty"`
	// OOMKills counts memory.max kills seen in the lease (memory.events).
	OOMKills  int64         `json:"oom_kills"`
	ClaimOp   string        `json:"claim_op"`
	ReleaseOp string        `json:"release_op,omitempty"`
	Nonce     string        `json:"nonce"`
	Netns     string        `json:"netns"`
	Root      string        `json:"root"`
	Bundle    string        `json:"bundle"`
	Request   *ClaimRequest `json:"request,omitempty"`
	// Warm marks a warm pool member's record (bucket "warm", never a
	// sandbox's): its guest boots the warm agent with no workload.
	Warm bool `json:"warm,omitempty"`
	// WarmMember is the member a claim took (its objects are named by
	// ContainerID, the member's id); "" for a cold claim.
	WarmMember string `json:"warm_member,omitempty"`
	// Withheld is set when cleanup of this generation could not be proven:
	// its capacity stays out until an operator or a later proof clears it.
	Withheld bool `json:"withheld,omitempty"`
	// ProofOp is the operation id the latest cleanup proof of this
	// generation is stored under.
	ProofOp string `json:"proof_op,omitempty"`
	// Kernel identities of the generation's objects, recorded once made,
	// so the cleanup proof checks the objects and not only their names:
	// the overlay's superblock (major:minor) and the netns (nsfs device,
	// inode, cookie).
	RootDev     string `json:"root_dev,omitempty"`
	NetnsDev    uint64 `json:"netns_dev,omitempty"`
	NetnsIno    uint64 `json:"netns_ino,omitempty"`
	NetnsCookie uint64 `json:"netns_cookie,omitempty"`
	// Retries of a withheld generation's teardown (see node/withheld.go).
	RetryAttempts int       `json:"retry_attempts,omitempty"`
	RetryLast     time.Time `json:"retry_last,omitzero"`
	RetryNext     time.Time `json:"retry_next,omitzero"`
	// DiskProject is the project id whose quota bounds the generation's
	// scratch dir (0: none, a record from before disk leases).
	DiskProject uint32 `json:"disk_project,omitempty"`
	// Slot is the generation's block of the node's address pool
	// (netpolicy.Slot), allocated in the claim's journal transaction like
	// DiskProject and free again only when a clean proof ends the record
	// (0: none, a record from before the sandbox network).
	Slot uint32 `json:"slot,omitempty"`
	// Network is the policy in force once a live update changed it (nil:
	// the claim's, Request.Network); NetworkUpdate is an update journaled
	// as intended and not yet done: a new primary applies it again.
	Network       *NetworkPolicy `json:"network,omitempty"`
	NetworkUpdate *NetworkUpdate `json:"network_update,omitempty"`
	// Block is the writer of a block-mode generation: journaled with its
	// writer epoch before the writer starts, completed with the device
	// once attached (nil: overlay mode, or not started yet).
	Block *BlockDevice `json:"block,omitempty"`
	// Seal is the last pause of the generation (absent: never paused).
	Seal *SealRecord `json:"seal,omitempty"`
	// Volumes are the persistent volumes the generation attached, each
	// journaled with its writer epoch before its writer starts.
	Volumes []AttachedVolume `json:"volumes,omitempty"`
	// Exit is how the generation's guest ended (nil: it did not, or
	// nobody saw it).
	Exit *ExitRecord `json:"exit,omitempty"`
}

// AttachedVolume is a persistent volume attached to a generation: its
// writer and device (as BlockDevice), the host mount of its filesystem,
// and what its detach published.
type AttachedVolume struct {
	ID   string `json:"id"`
	Path string `json:"path"` // in the guest
	// WriterEpoch, Dir, Index, PID and Size as BlockDevice's.
	WriterEpoch uint64 `json:"writer_epoch"`
	Dir         string `json:"dir"`
	Index       int    `json:"index"`
	PID         int    `json:"pid,omitempty"`
	Size        int64  `json:"size,omitempty"`
	// Restarts counts the writers started on the device after the one
	// before died (each with a new epoch), as BlockDevice's.
	Restarts int `json:"restarts,omitempty"`
	// Head is the volume's head the attach started from (the device
	// writes over its generation): the detach publishes over exactly it.
	Head VolumeHead `json:"head"`
	// Mount is the host mount point, RootDev its superblock's device.
	Mount   string `json:"mount,omitempty"`
	RootDev string `json:"root_dev,omitempty"`
	// Published is the head the detach published; PublishError why it
	// published none (fenced, or the writer was gone): the attach's
	// writes are then not in the volume, and the proof says so.
	Published    *VolumeHead `json:"published,omitempty"`
	PublishError string      `json:"publish_error,omitempty"`
}

// BlockDevice is a block-mode generation's writer process and device.
type BlockDevice struct {
	// WriterEpoch is the attach's writer epoch (NextWriterEpoch): a
	// writer reporting another is not this generation's.
	WriterEpoch uint64 `json:"writer_epoch"`
	// Dir is the writer's directory (dirty file, index, lock, state).
	Dir string `json:"dir"`
	// Template is the template volume the device writes over.
	Template string `json:"template"`
	// Index is the attached /dev/nbd<Index> (-1: not known yet), PID the
	// writer process, Size the device size (the disk lease).
	Index int   `json:"index"`
	PID   int   `json:"pid,omitempty"`
	Size  int64 `json:"size,omitempty"`
	// Restarts counts the writers started on the same device after the
	// one before died (each with a new epoch).
	Restarts int `json:"restarts,omitempty"`
	// BaseVolume and BaseGeneration name the generation the device writes
	// over: the template's, the sandbox head's on a resume, and after a
	// seal the sealed one (the writer rebased onto it). A restarted writer
	// opens over it. Empty (records before pause): the template's
	// generation 0.
	BaseVolume     string `json:"base_volume,omitempty"`
	BaseGeneration uint64 `json:"base_generation,omitempty"`
	// Head is the sandbox volume's head the claim started from (Seq 0:
	// none, a fresh sandbox): a pause publishes over exactly it.
	Head VolumeHead `json:"head,omitzero"`
}

// VolumeHead is a sandbox volume's published head (blockstore.Head).
type VolumeHead struct {
	Seq         uint64 `json:"seq"`
	Generation  uint64 `json:"generation"`
	WriterEpoch uint64 `json:"writer_epoch"`
	Node        string `json:"node,omitempty"`
}

// SealState is where a pause's seal is.
type SealState string

// Seal states. A seal is journaled as sealing before the device is frozen;
// a primary that finds one sealing on takeover marks it abandoned: the
// head was not moved (a pause publishes only after its seal committed),
// and whatever the guest wrote since it is the running generation's dirty
// tail, never a pause.
const (
	SealSealing   SealState = "sealing"
	SealPublished SealState = "published"
	SealAbandoned SealState = "abandoned"
)

// SealRecord is the last pause of a generation.
type SealRecord struct {
	State       SealState  `json:"state"`
	OperationID string     `json:"operation_id"`
	Generation  uint64     `json:"generation,omitempty"` // the block generation sealed
	Head        VolumeHead `json:"head,omitzero"`        // published
	// Result is the seal's SealResult as JSON (kept as the bytes it was
	// journaled as).
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// SealResult is what a seal committed and what it cost: its JSON is
// journaled in SealRecord.Result (and the API answers it as it is).
type SealResult struct {
	// Generation is the block generation the seal committed; Parent the
	// generation it wrote over ("sandboxes/ID@N" or "templates/NAME@0").
	Generation uint64 `json:"generation"`
	Parent     string `json:"parent"`
	// Chunks the seal wrote (data and zero), and the data bytes.
	Chunks     int   `json:"chunks"`
	DataChunks int   `json:"data_chunks"`
	ZeroChunks int   `json:"zero_chunks"`
	Bytes      int64 `json:"bytes"`
	// FreezeMS is how long the guest's filesystem was frozen (its write
	// barrier); SealMS the writer's seal; TotalMS the whole call.
	FreezeMS  float64 `json:"freeze_ms"`
	BarrierMS float64 `json:"barrier_ms"`
	SealMS    float64 `json:"seal_ms"`
	TotalMS   float64 `json:"total_ms"`
}

// NetworkUpdate is a live policy update in flight.
type NetworkUpdate struct {
	OperationID string        `json:"operation_id,omitempty"`
	Policy      NetworkPolicy `json:"policy"`
}

// Holds reports whether the record still holds leased capacity: a live or
// half-done generation does until a clean cleanup proof ends it; one whose
// cleanup is unproven moved to the withheld ledger instead.
func (s Sandbox) Holds() bool {
	switch s.State {
	case StateClaiming, StateReady, StateReleasing, StateLost, StateExited:
		return !s.Withheld
	}
	return false
}

// OpKind is the kind of a mutating call.
type OpKind string

// Operation kinds.
const (
	OpClaim   OpKind = "claim"
	OpRelease OpKind = "release"
	OpPause   OpKind = "pause"
)

// OpState is where an operation is.
type OpState string

// Operation states.
const (
	OpPending OpState = "pending"
	OpDone    OpState = "done"
	OpFailed  OpState = "failed"
)

// OpError is how a failed operation failed: its kind and message, answered
// again to a retry of the same operation id.
type OpError struct {
	Code    errdefs.Code `json:"code"`
	Message string       `json:"message"`
}

// Operation is a mutating call's record, keyed by its operation_id.
type Operation struct {
	RecordVersion int             `json:"record_version,omitempty"`
	ID            string          `json:"id"`
	Kind          OpKind          `json:"kind"`
	SandboxID     string          `json:"sandbox_id"`
	Generation    uint64          `json:"generation"`
	RequestHash   string          `json:"request_hash"`
	State         OpState         `json:"state"`
	Result        json.RawMessage `json:"result,omitempty"`
	Error         *OpError        `json:"error,omitempty"`
	Epoch         uint64          `json:"epoch"`
	Created       time.Time       `json:"created"`
}

// Journal is the bbolt database, bound to the epoch of the term that took
// it over (see TakeOver); writes of a handle that did not are refused.
type Journal struct {
	db    *bolt.DB
	epoch uint64
	// commits counts the write transactions this handle committed (see
	// Commits).
	commits atomic.Uint64
	// onCommit, if set, is told how long each committed Update took
	// (OnCommit).
	onCommit atomic.Pointer[func(time.Duration)]
}

// Open opens (creating if needed) the journal at path. bbolt takes its own
// flock, so only one process holds it open; timeout bounds the wait for it
// (0 would wait forever behind a wedged holder). Call TakeOver before any
// write.
func Open(path string, timeout time.Duration) (*Journal, error) {
	if timeout <= 0 {
		return nil, fmt.Errorf("open journal %s: a positive timeout is required", path)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout})
	if err != nil {
		return nil, fmt.Errorf("open journal %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		unindexed := tx.Bucket(bucketLive) == nil
		for _, b := range [][]byte{bucketEffects, bucketSandboxes, bucketOperations, bucketProofs, bucketLive, bucketPending, bucketHistory, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if unindexed {
			return buildIndex(tx)
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init journal %s: %w", path, err)
	}
	return &Journal{db: db}, nil
}

// Close closes the database.
func (j *Journal) Close() error { return j.db.Close() }

// Tx is a read-write view used to change several records atomically.
type Tx struct{ tx *bolt.Tx }

// Update runs fn in one durable transaction, after checking inside it that
// this handle's epoch is the journal's current epoch (else a *FencedError
// and nothing is written).
func (j *Journal) Update(fn func(*Tx) error) error {
	start := time.Now()
	err := j.db.Update(func(tx *bolt.Tx) error {
		if err := j.fence(tx); err != nil {
			return err
		}
		return fn(&Tx{tx})
	})
	if err == nil {
		j.commits.Add(1)
		if f := j.onCommit.Load(); f != nil {
			(*f)(time.Since(start))
		}
	}
	return err
}

// OnCommit has f told the duration of each Update that commits from now
// on: the whole write transaction, fsync included (metrics).
func (j *Journal) OnCommit(f func(time.Duration)) { j.onCommit.Store(&f) }

// Size is the size of the journal's database file (bbolt grows it in
// steps and never shrinks it).
func (j *Journal) Size() (int64, error) {
	st, err := os.Stat(j.db.Path())
	if err != nil {
		return 0, fmt.Errorf("read journal size: %w", err)
	}
	return st.Size(), nil
}

// Commits is the number of write transactions this handle committed
// (Update and TakeOver): each is one fsync'd bbolt commit, the cost a
// claim's journaling is measured in.
func (j *Journal) Commits() uint64 { return j.commits.Load() }

// View runs fn in a read-only transaction.
func (j *Journal) View(fn func(*Tx) error) error {
	return j.db.View(func(tx *bolt.Tx) error { return fn(&Tx{tx}) })
}

func put(tx *bolt.Tx, bucket []byte, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s/%s: %w", bucket, key, err)
	}
	return tx.Bucket(bucket).Put([]byte(key), b)
}

// ErrNewerRecord is the kind of error for a record written by a newer ctld
// (a RecordVersion above this one's): reading it as this version would drop
// what it does not know.
var ErrNewerRecord = errors.New("journal record of a newer version")

// decode reads one record, refusing a newer version than this package
// writes.
func decode(bucket, key, b []byte, v any) error {
	var head struct {
		RecordVersion int `json:"record_version"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return fmt.Errorf("decode %s/%s: %w", bucket, key, err)
	}
	if head.RecordVersion > RecordVersion {
		return fmt.Errorf("decode %s/%s: %w: version %d, this ctld reads up to %d", bucket, key, ErrNewerRecord, head.RecordVersion, RecordVersion)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s/%s: %w", bucket, key, err)
	}
	return nil
}

func get(tx *bolt.Tx, bucket []byte, key string, v any) (bool, error) {
	b := tx.Bucket(bucket).Get([]byte(key))
	if b == nil {
		return false, nil
	}
	if err := decode(bucket, []byte(key), b, v); err != nil {
		return false, err
	}
	return true, nil
}

func all[T any](tx *bolt.Tx, bucket []byte) ([]T, error) {
	var out []T
	err := tx.Bucket(bucket).ForEach(func(k, v []byte) error {
		var t T
		if err := decode(bucket, k, v, &t); err != nil {
			return err
		}
		out = append(out, t)
		return nil
	})
	return out, err
}

// PutEffect records an effect in its current state.
func (t *Tx) PutEffect(e Effect) error {
	e.RecordVersion = RecordVersion
	e.Updated = time.Now().UTC()
	return put(t.tx, bucketEffects, string(e.key()), e)
}

// DeleteEffect forgets an effect whose object is gone.
func (t *Tx) DeleteEffect(kind Kind, name string) error {
	return t.tx.Bucket(bucketEffects).Delete(effectKey(kind, name))
}

// Effect reads the effect record of one object.
func (t *Tx) Effect(kind Kind, name string) (Effect, bool, error) {
	var e Effect
	ok, err := get(t.tx, bucketEffects, string(effectKey(kind, name)), &e)
	return e, ok, err
}

// Effects lists all effects, ordered by kind and name.
func (t *Tx) Effects() ([]Effect, error) { return all[Effect](t.tx, bucketEffects) }

// PutSandbox stores a sandbox record (and indexes it: see index.go).
func (t *Tx) PutSandbox(s Sandbox) error {
	s.RecordVersion = RecordVersion
	if err := indexSandbox(t.tx, s); err != nil {
		return fmt.Errorf("index sandbox %s: %w", s.ID, err)
	}
	return put(t.tx, bucketSandboxes, s.ID, s)
}

// Sandbox reads a sandbox record.
func (t *Tx) Sandbox(id string) (Sandbox, bool, error) {
	var s Sandbox
	ok, err := get(t.tx, bucketSandboxes, id, &s)
	return s, ok, err
}

// Sandboxes lists all sandbox records, history included, ordered by id.
// Hot paths use LiveSandboxes.
func (t *Tx) Sandboxes() ([]Sandbox, error) {
	ss, err := all[Sandbox](t.tx, bucketSandboxes)
	sort.Slice(ss, func(i, k int) bool { return ss[i].ID < ss[k].ID })
	return ss, err
}

// PutOperation stores an operation record (and indexes it).
func (t *Tx) PutOperation(o Operation) error {
	o.RecordVersion = RecordVersion
	if err := indexOperation(t.tx, o); err != nil {
		return fmt.Errorf("index operation %s: %w", o.ID, err)
	}
	return put(t.tx, bucketOperations, o.ID, o)
}

// Operation reads an operation record.
func (t *Tx) Operation(id string) (Operation, bool, error) {
	var o Operation
	ok, err := get(t.tx, bucketOperations, id, &o)
	return o, ok, err
}

// Operations lists all operation records, history included. Hot paths use
// PendingOperations.
func (t *Tx) Operations() ([]Operation, error) { return all[Operation](t.tx, bucketOperations) }

// PutProof stores a cleanup proof under its operation id (and indexes it).
// The proof is its own versioned record (proof.Proof, Version).
func (t *Tx) PutProof(p proof.Proof) error {
	if err := indexProof(t.tx, p); err != nil {
		return fmt.Errorf("index proof %s: %w", p.OperationID, err)
	}
	return put(t.tx, bucketProofs, p.OperationID, p)
}

// Proof reads a cleanup proof.
func (t *Tx) Proof(opID string) (proof.Proof, bool, error) {
	var p proof.Proof
	ok, err := get(t.tx, bucketProofs, opID, &p)
	return p, ok, err
}

// ErrNotFound is returned by lookups that must find their record.
var ErrNotFound = errors.New("not found")
