package apiserver

// Conversions between the node's domain types (the journal's records, the
// proof record) and the API's wire types. The journal keeps its own
// versioned types so a change of the API's JSON never changes what is on
// disk; the adapter converts at the edge, here, and nowhere else.

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node"
	"github.com/ctld/ctld/internal/proof"
)

// apiSandbox is the wire form of a sandbox record.
func apiSandbox(s journal.Sandbox) api.Sandbox {
	return api.Sandbox{
		ID: s.ID, Generation: s.Generation, State: api.SandboxState(s.State), ContainerID: s.ContainerID,
		LeaseID: s.LeaseID, Resources: apiResources(s.Resources), RootFS: apiRootFS(s.RootFS), Epoch: s.Epoch,
		CreatedAt: s.CreatedAt, Timings: apiTimings(s.Timings), ReleaseTimings: apiReleaseTimings(s.ReleaseTimings),
		Reason: s.Reason, OOMKills: s.OOMKills, Writer: apiWriter(s), Pause: apiPause(s), Volumes: apiVolumes(s),
		Exit: apiExit(s.Exit), ProofOperationID: s.ProofOp,
	}
}

// apiExit is the wire form of a generation's exit.
func apiExit(e *journal.ExitRecord) *api.ExitStatus {
	if e == nil {
		return nil
	}
	return &api.ExitStatus{Kind: string(e.Kind), Code: e.Code, At: e.At, SeenBy: e.SeenBy, OOMKills: e.OOMKills, Detail: e.Detail}
}

// apiWriter is s's writer while the generation holds its device.
func apiWriter(s journal.Sandbox) *api.BlockWriter {
	if s.Block == nil || !s.Holds() {
		return nil
	}
	w := &api.BlockWriter{Epoch: s.Block.WriterEpoch, PID: s.Block.PID, Restarts: s.Block.Restarts}
	if s.Block.BaseVolume != "" {
		w.Base = s.Block.BaseVolume + "@" + strconv.FormatUint(s.Block.BaseGeneration, 10)
	}
	if s.Block.Index >= 0 {
		w.Device = "/dev/nbd" + strconv.Itoa(s.Block.Index)
	}
	return w
}

func apiResources(r journal.Resources) api.Resources {
	return api.Resources{CPUMillis: r.CPUMillis, MemoryBytes: r.MemoryBytes, PIDs: r.PIDs, Cpuset: r.Cpuset, DiskBytes: r.DiskBytes}
}

func resourcesRecord(r api.Resources) journal.Resources {
	return journal.Resources{CPUMillis: r.CPUMillis, MemoryBytes: r.MemoryBytes, PIDs: r.PIDs, Cpuset: r.Cpuset, DiskBytes: r.DiskBytes}
}

func apiRootFS(r journal.RootFS) api.RootFS {
	return api.RootFS{Mode: api.RootFSMode(r.Mode), Template: r.Template, ExpectHead: apiHead(r.ExpectHead), WriterEpoch: r.WriterEpoch}
}

func rootFSRecord(r api.RootFS) journal.RootFS {
	return journal.RootFS{Mode: journal.RootFSMode(r.Mode), Template: r.Template, ExpectHead: journalHead(r.ExpectHead), WriterEpoch: r.WriterEpoch}
}

func apiTimings(t journal.Timings) api.Timings {
	return api.Timings{AdmitMS: t.AdmitMS, LeaseMS: t.LeaseMS, RootFSMS: t.RootFSMS, NetworkMS: t.NetworkMS,
		RunscMS: t.RunscMS, ProofMS: t.ProofMS, TotalMS: t.TotalMS, Steps: apiSteps(t.Steps)}
}

// claimRecord is the claim as the node takes it (and the journal keeps
// it), owning its slices. Its JSON is the wire request's for every valid
// claim (a claim's Volumes never carry a Head), so the node's request hash
// of an operation is unchanged (TestClaimRecordEncodesLikeTheWire).
func claimRecord(r api.ClaimRequest) journal.ClaimRequest {
	return journal.ClaimRequest{
		OperationID: r.OperationID, Generation: r.Generation, RootFS: rootFSRecord(r.RootFS),
		Resources: resourcesRecord(r.Resources), Network: networkRecord(r.Network),
		Process: journal.Process{
			Args: append([]string(nil), r.Process.Args...), Env: append([]string(nil), r.Process.Env...),
			Cwd: r.Process.Cwd, UID: r.Process.UID, GID: r.Process.GID, UserSet: r.Process.UserSet,
		},
		MaxLifetimeSec: r.MaxLifetimeSec, Volumes: volumeMountsRecord(r.Volumes), OnExit: r.OnExit,
	}
}

func volumeMountsRecord(vs []api.VolumeMount) []journal.VolumeMount {
	if vs == nil {
		return nil
	}
	out := make([]journal.VolumeMount, len(vs))
	for i, v := range vs {
		out[i] = journal.VolumeMount{ID: v.ID, Path: v.Path, ExpectHead: journalHead(v.ExpectHead)}
	}
	return out
}

// apiVolumes are the persistent volumes s's claim attaches, each with
// the head its detach published (else the head its attach started from),
// which the manager keeps as its next claim's expected head.
func apiVolumes(s journal.Sandbox) []api.VolumeMount {
	if s.Request == nil || s.Request.Volumes == nil {
		return nil
	}
	out := make([]api.VolumeMount, len(s.Request.Volumes))
	for i, v := range s.Request.Volumes {
		out[i] = api.VolumeMount{ID: v.ID, Path: v.Path, ExpectHead: apiHead(v.ExpectHead)}
		for _, av := range s.Volumes {
			if av.ID != v.ID {
				continue
			}
			h := apiHead(av.Head)
			if av.Published != nil {
				h = apiHead(*av.Published)
			}
			if h.Seq > 0 {
				out[i].Head = &h
			}
		}
	}
	return out
}

func apiSteps(steps []journal.StepTiming) []api.StepTiming {
	if steps == nil {
		return nil
	}
	out := make([]api.StepTiming, len(steps))
	for i, s := range steps {
		out[i] = api.StepTiming(s)
	}
	return out
}

func apiReleaseTimings(t *journal.ReleaseTimings) *api.ReleaseTimings {
	if t == nil {
		return nil
	}
	return &api.ReleaseTimings{Steps: apiSteps(t.Steps), ProofMS: t.ProofMS, TotalMS: t.TotalMS}
}

func networkRecord(p api.NetworkPolicy) journal.NetworkPolicy {
	out := journal.NetworkPolicy{Mode: journal.NetworkMode(p.Mode)}
	for _, r := range p.Rules {
		out.Rules = append(out.Rules, journal.NetworkRule{CIDR: r.CIDR, Domain: r.Domain, Protocol: r.Protocol, Ports: append([]string(nil), r.Ports...)})
	}
	return out
}

// apiPause is s's last pause.
func apiPause(s journal.Sandbox) *api.PauseStatus {
	if s.Seal == nil {
		return nil
	}
	return &api.PauseStatus{State: string(s.Seal.State), OperationID: s.Seal.OperationID, Generation: s.Seal.Generation, Head: apiHead(s.Seal.Head), Error: s.Seal.Error}
}

func apiHead(h journal.VolumeHead) api.VolumeHead {
	return api.VolumeHead{Seq: h.Seq, Generation: h.Generation, WriterEpoch: h.WriterEpoch, Node: h.Node}
}

func journalHead(h api.VolumeHead) journal.VolumeHead {
	return journal.VolumeHead{Seq: h.Seq, Generation: h.Generation, WriterEpoch: h.WriterEpoch, Node: h.Node}
}

// apiView is the wire form of a sandbox with its live facts.
func apiView(v node.SandboxView) api.Sandbox {
	out := apiSandbox(v.Sandbox)
	if st := v.Network; st != nil {
		out.Network = &api.NetworkStatus{Mode: api.NetworkMode(st.Mode), TxBytes: st.TxBytes, TxPackets: st.TxPackets, DroppedPackets: st.DroppedPackets}
	}
	if v.Usage != nil {
		u := apiUsage(*v.Usage)
		out.Usage = &u
	}
	return out
}

// Answers is node.Answers: the wire answers the node stores with a
// finished operation, so a repeat of the operation id (on this primary or
// the next) gets the same bytes.
type Answers struct{}

var _ node.Answers = Answers{}

// Claimed is the answer of a claim: the ready sandbox.
func (Answers) Claimed(s journal.Sandbox) (json.RawMessage, error) {
	return json.Marshal(api.ClaimResponse{Sandbox: apiSandbox(s)})
}

// Released is the answer of a release: the sandbox and its cleanup proof.
func (Answers) Released(s journal.Sandbox, p proof.Proof) (json.RawMessage, error) {
	return json.Marshal(api.ReleaseResponse{Sandbox: apiSandbox(s), Proof: api.CleanupProofOf(p)})
}

// Paused is the answer of a pause: the published head, the seal (as the
// node journaled it) and the release's cleanup proof.
func (Answers) Paused(s journal.Sandbox, p proof.Proof) (json.RawMessage, error) {
	out := api.PauseResponse{Sandbox: apiSandbox(s), Proof: api.CleanupProofOf(p)}
	if s.Seal != nil {
		out.Head = apiHead(s.Seal.Head)
		if len(s.Seal.Result) > 0 {
			if err := json.Unmarshal(s.Seal.Result, &out.Seal); err != nil {
				return nil, fmt.Errorf("decode journaled seal: %w", err)
			}
		}
	}
	return json.Marshal(out)
}

// apiNode is the wire form of the node's info (GET /v1/node).
func apiNode(n node.Info) api.Node {
	out := api.Node{
		NodeID: n.NodeID, BootID: n.BootID, Slot: n.Slot, Role: api.RolePrimary, Epoch: n.Epoch, NodeKey: n.NodeKey,
		Versions: api.Versions(n.Versions),
		Capacity: api.NodeCapacity{Total: api.Capacity(n.Capacity.Total), Allocatable: api.Capacity(n.Capacity.Allocatable),
			Leased: api.Capacity(n.Capacity.Leased), Warm: api.Capacity(n.Capacity.Warm), Withheld: api.Capacity(n.Capacity.Withheld)},
	}
	if r := n.Rotation; r != nil {
		out.KeyRotation = &api.KeyRotation{Version: r.Version, NodeID: r.NodeID, OldKey: r.OldKey, NewKey: r.NewKey,
			IssuedAt: r.IssuedAt, OldSignature: r.OldSignature, NewSignature: r.NewSignature}
	}
	for _, tpl := range slices.Sorted(maps.Keys(n.WarmPools)) {
		p := n.WarmPools[tpl]
		out.WarmPools = append(out.WarmPools, api.WarmPool{Template: tpl, Idle: p.Idle, Booting: p.Booting, Hits: p.Hits, Misses: p.Misses})
	}
	for _, w := range n.Withheld {
		checks := make([]api.ProofCheck, len(w.FailedChecks))
		for i, c := range w.FailedChecks {
			checks[i] = api.ProofCheck(c)
		}
		out.Withheld = append(out.Withheld, api.WithheldLease{
			SandboxID: w.SandboxID, Generation: w.Generation, Reason: w.Reason, Resources: api.Capacity(w.Resources),
			FailedChecks: checks, ProofOperationID: w.ProofOperationID, RetryAttempts: w.RetryAttempts,
			LastAttempt: w.LastAttempt, NextAttempt: w.NextAttempt,
		})
	}
	return out
}

// guestUser is the guest user of a call (nil: the workload's).
func guestUser(u *api.User) *wire.User {
	if u == nil {
		return nil
	}
	return &wire.User{UID: u.UID, GID: u.GID}
}

// execRecord is an exec or session request as the node takes it.
func execRecord(r api.ExecRequest) node.ExecRequest {
	return node.ExecRequest{Args: r.Args, Env: r.Env, Cwd: r.Cwd, Stdin: r.Stdin, TimeoutSec: r.TimeoutSec,
		User: guestUser(r.User), TTY: r.TTY, Rows: r.Rows, Cols: r.Cols}
}

func apiFileInfo(st wire.Stat) api.FileInfo {
	return api.FileInfo{Name: st.Name, Size: st.Size, Mode: st.Mode, ModUnix: st.ModUnix, UID: st.UID, GID: st.GID, Link: st.Link}
}

// apiVolume is the wire form of a sandbox volume (of a call that returned
// err).
func apiVolume(v node.VolumeInfo, err error) (api.VolumeInfo, error) {
	if err != nil {
		return api.VolumeInfo{}, err
	}
	out := api.VolumeInfo{Sandbox: v.Sandbox, Head: apiHead(v.Head), Snapshots: make([]api.Snapshot, len(v.Snapshots)), Generations: v.Generations}
	for i, s := range v.Snapshots {
		out.Snapshots[i] = api.Snapshot(s)
	}
	if out.Generations == nil {
		out.Generations = []uint64{}
	}
	return out, nil
}
