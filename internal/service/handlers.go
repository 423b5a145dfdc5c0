package service

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
)

// record is what the service keeps as a sandbox's spec (owned_sandboxes.spec):
// the manager's spec and the template's name.
type record struct {
	Spec manager.Spec `json:"spec"`
	// Fork, on a forked sandbox, is where its files come from.
	Fork *forkOf `json:"fork,omitempty"`
	// IdleSec is the create's idle_timeout_sec (a fork inherits it).
	IdleSec int64 `json:"idle_sec,omitempty"`
	// OnExit is the create's on_exit (exits.go).
	OnExit string `json:"on_exit,omitempty"`
}

var (
	labelKey = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$`)
	envKey   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
)

const (
	maxLabels     = 32
	maxLabelValue = 255
	maxEnv        = 256
)

func invalidf(format string, args ...any) error {
	return errorf(client.CodeInvalidArgument, fmt.Sprintf(format, args...))
}

func checkLabels(labels map[string]string) error {
	if len(labels) > maxLabels {
		return invalidf("at most %d labels", maxLabels)
	}
	for k, v := range labels {
		if !labelKey.MatchString(k) {
			return invalidf("label key %s: lower-case letters, digits and ._/-, 1 to 63 characters", errdefs.Quote(k))
		}
		if len(v) > maxLabelValue || strings.ContainsFunc(v, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
			return invalidf("label %s: value longer than %d bytes or with control characters", k, maxLabelValue)
		}
	}
	return nil
}

func envList(env map[string]string) ([]string, error) {
	if len(env) > maxEnv {
		return nil, invalidf("at most %d environment variables", maxEnv)
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		if !envKey.MatchString(k) {
			return nil, invalidf("environment variable name %s is not valid", errdefs.Quote(k))
		}
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out, nil
}

func (s *Server) template(name string) (client.Template, bool) {
	for _, t := range s.Templates {
		if t.Name == name {
			return t, true
		}
	}
	return client.Template{}, false
}

// specOf converts a create request into the manager's spec.
func (s *Server) specOf(req client.CreateRequest) (manager.Spec, error) {
	t, ok := s.template(req.Template)
	if !ok {
		return manager.Spec{}, invalidf("template %s is not offered here (GET /v1/templates)", errdefs.Quote(req.Template))
	}
	res := client.Resources{CPU: "500m", Memory: "256Mi", PIDs: 256}
	if req.Resources != nil {
		res.CPU = cmpOr(req.Resources.CPU, res.CPU)
		res.Memory = cmpOr(req.Resources.Memory, res.Memory)
		res.Disk = req.Resources.Disk
		if req.Resources.PIDs != 0 {
			res.PIDs = req.Resources.PIDs
		}
	}
	cpu, err := manager.ParseCPU(res.CPU)
	if err != nil {
		return manager.Spec{}, invalidf("resources.cpu: %v", err)
	}
	mem, err := manager.ParseMemory(res.Memory)
	if err != nil {
		return manager.Spec{}, invalidf("resources.memory: %v", err)
	}
	var disk int64
	if res.Disk != "" {
		if disk, err = manager.ParseMemory(res.Disk); err != nil {
			return manager.Spec{}, invalidf("resources.disk: %v", err)
		}
	}
	env, err := envList(req.Env)
	if err != nil {
		return manager.Spec{}, err
	}
	spec := manager.Spec{
		Resources: api.Resources{CPUMillis: cpu, MemoryBytes: mem, PIDs: res.PIDs, DiskBytes: disk},
		RootFS:    api.RootFS{Mode: api.RootFSMode(t.Mode), Template: t.Name},
		Process:   api.Process{Args: req.Args, Env: env, Cwd: req.Cwd},
	}
	if req.User != nil {
		spec.Process.UID, spec.Process.GID = req.User.UID, req.User.GID
		spec.User = &api.User{UID: req.User.UID, GID: req.User.GID} // root too, over the image's
	}
	if req.Network != nil {
		spec.Network = policyOf(*req.Network)
	}
	if len(req.Volumes) > api.MaxVolumes {
		return manager.Spec{}, invalidf("at most %d volumes", api.MaxVolumes)
	}
	for _, v := range req.Volumes {
		if err := checkID(v.ID); err != nil {
			return manager.Spec{}, err
		}
		spec.Volumes = append(spec.Volumes, api.VolumeMount{ID: v.ID, Path: v.Path})
	}
	if err := spec.Validate(); err != nil {
		return manager.Spec{}, err
	}
	return spec, nil
}

func volumeIDs(vs []api.VolumeMount) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.ID)
	}
	return out
}

func cmpOr(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, owner string) error {
	wait := true
	switch r.URL.Query().Get("wait") {
	case "", "true":
	case "false":
		wait = false
	default:
		return invalidf("wait must be true or false")
	}
	var req client.CreateRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := checkLabels(req.Labels); err != nil {
		return err
	}
	spec, err := s.specOf(req)
	if err != nil {
		return err
	}
	deadline, err := s.deadline(req.TimeoutSec)
	if err != nil {
		return err
	}
	if req.IdleTimeoutSec < 0 || time.Duration(req.IdleTimeoutSec)*time.Second > orDefault(s.MaxTimeout, DefaultMaxTimeout) {
		return invalidf("idle_timeout_sec must be between 0 and %d", int64(orDefault(s.MaxTimeout, DefaultMaxTimeout)/time.Second))
	}
	id, err := s.newID()
	if err != nil {
		return err
	}
	if req.OnExit != "" && req.OnExit != client.OnExitKeep && req.OnExit != client.OnExitDestroy {
		return invalidf("on_exit must be %q or %q", client.OnExitKeep, client.OnExitDestroy)
	}
	recJSON, err := json.Marshal(record{Spec: spec, IdleSec: req.IdleTimeoutSec, OnExit: req.OnExit})
	if err != nil {
		return fmt.Errorf("encode spec: %w", err)
	}
	in := manager.Admission{
		Owner: owner, ID: id, Spec: recJSON, Labels: req.Labels,
		CPUMillis: spec.Resources.CPUMillis, Memory: spec.Resources.MemoryBytes, Disk: spec.Resources.DiskBytes,
		Deadline: deadline, Idle: time.Duration(req.IdleTimeoutSec) * time.Second, Volumes: volumeIDs(spec.Volumes),
	}
	// The create's lease is taken in the admission's transaction: a
	// replica that dies from here on leaves the create, and its caller's
	// Idempotency-Key, to another (replica.go), which finds it admitted
	// or not. Taken after, a replica dying in between left an admitted
	// create that no lease named: its key was forgotten as an orphan and
	// the caller's retry made a second sandbox. Taken before in a
	// transaction of its own, a create cost one write more (SQLITE_BUSY
	// under load). No lease (the database is away): no create.
	lease := s.opLease(r, leaseCreate, owner, id)
	if !s.startOp(lease.ID) {
		return errdefs.Busy(time.Second, "operation %s is running here; retry", lease.ID)
	}
	in.Lease, in.LeaseTTL = &lease, s.leaseTTL()
	if err := s.Store.AdmitCreate(r.Context(), in); err != nil {
		if errdefs.CodeOf(err) != errdefs.CodeUnavailable || errors.Is(err, manager.ErrLeaseHeld) {
			// Refused (quota, bad input, the lease held): neither the
			// admission nor the lease was recorded.
			s.endOp(lease.ID)
			return err
		}
		// The database went away: the admission and its lease may have
		// committed (both or neither): they and the Idempotency-Key are
		// left to a sweeper, which finds out.
		s.letGoOf(r.Context(), r, lease.ID, false)
		return err
	}
	s.emit(owner, id, client.EventCreated, "")
	claim := func(ctx context.Context) error {
		err := s.claim(ctx, owner, id, spec, failedPrefix)
		settled, serr := s.createSettled(ctx, owner, id)
		s.letGoOf(ctx, r, lease.ID, serr == nil && settled)
		return err
	}
	if !wait {
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			claim(context.WithoutCancel(s.baseCtx))
		}()
		return s.answer(w, r, owner, id, http.StatusAccepted)
	}
	// A caller that goes away does not abandon the claim: it runs to its
	// end (bounded by CreateTimeout) and GET shows the outcome.
	if err := claim(context.WithoutCancel(r.Context())); err != nil {
		return err
	}
	return s.answer(w, r, owner, id, http.StatusCreated)
}

// deadline is when a sandbox created now with timeoutSec ends (zero:
// never); 0 is the server's default.
func (s *Server) deadline(timeoutSec int64) (time.Time, error) {
	timeout := time.Duration(timeoutSec) * time.Second
	maxT := orDefault(s.MaxTimeout, DefaultMaxTimeout)
	switch {
	case timeoutSec < 0 || timeout > maxT:
		return time.Time{}, invalidf("timeout_sec must be between 0 and %d", int64(maxT/time.Second))
	case timeoutSec == 0:
		timeout = s.DefaultTimeout
	}
	if timeout <= 0 {
		return time.Time{}, nil
	}
	return s.now().Add(timeout), nil
}

// Reasons of a create the node refused: one run to its end by its
// replica, and one another replica took over (ctld rolls back a claim
// whose caller went away, and answers its repeat the same way).
const (
	failedPrefix      = "create failed: "
	interruptedPrefix = "create interrupted: its replica stopped during it and the node refused the claim: "
)

// claim runs the manager's create within CreateTimeout. A create that
// failed for good (the node refused it, or it never reached the node)
// ends with failPrefix and the refusal as its reason, the owner's share
// back; one whose outcome is unknown keeps it until it is settled.
func (s *Server) claim(ctx context.Context, owner, id string, spec manager.Spec, failPrefix string) error {
	ctx, cancel := context.WithTimeout(ctx, orDefault(s.CreateTimeout, DefaultCreateTimeout))
	defer cancel()
	reasonOf := func(err error) string {
		_, msg, _ := classify(err)
		return failPrefix + msg
	}
	// The node's refusal fails the claim and ends the sandbox in one
	// transaction: a reader never sees it failed without its reason.
	_, err := s.Manager.CreateWith(ctx, id, spec, func(ctx context.Context, op manager.OperationRecord, err error) error {
		return s.Store.FailCreate(ctx, id, err.Error(), reasonOf(err))
	})
	if err == nil {
		s.emit(owner, id, client.EventReady, "")
		return nil
	}
	if errdefs.CodeOf(err) == errdefs.CodeConflict {
		// The id is this create's own: a live sandbox under it is this
		// create, finished by the replica that took it over while this
		// one stalled past its lease (it emitted ready).
		if sb, serr := s.Manager.Store.Sandbox(context.WithoutCancel(ctx), id); serr == nil && sb.Generation >= 1 &&
			(sb.State == api.StateReady || sb.State == api.StateExited) {
			s.log().Info("create finished by the replica that took it over", "sandbox", id, "state", sb.State)
			return nil
		}
	}
	s.log().Warn("create failed", "sandbox", id, "err", err)
	if errors.Is(err, manager.ErrDatabaseLost) {
		// Interrupted, not refused: the create stays unsettled (its
		// Idempotency-Key pending) for a sweeper, which claims it anew if
		// the node does not have it. Failed here, a retry of the key made
		// a second sandbox.
		return err
	}
	sctx := context.WithoutCancel(ctx)
	sb, serr := s.Manager.Store.Sandbox(sctx, id)
	if errdefs.CodeOf(serr) == errdefs.CodeNotFound || (serr == nil && sb.State == api.StateFailed) {
		// Ended already when the node refused it (EndOwnedSandbox keeps
		// the first reason); here when it never reached the node.
		if eerr := s.Store.EndOwnedSandbox(sctx, id, reasonOf(err)); eerr != nil {
			return errors.Join(err, eerr)
		}
		s.emit(owner, id, client.EventFailed, reasonOf(err))
	}
	return err
}

func (s *Server) owned(r *http.Request, owner string) (manager.OwnedSandbox, error) {
	id := r.PathValue("id")
	if err := checkID(id); err != nil {
		return manager.OwnedSandbox{}, err
	}
	return s.Store.OwnedSandbox(r.Context(), owner, id)
}

// checkID refuses what cannot be a sandbox id before any lookup.
func checkID(id string) error {
	if len(id) == 0 || len(id) > 64 || strings.ContainsFunc(id, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-')
	}) {
		return invalidf("invalid sandbox id %s", errdefs.Quote(id))
	}
	return nil
}

func (s *Server) answer(w http.ResponseWriter, r *http.Request, owner, id string, status int) error {
	sb, err := s.Store.OwnedSandbox(context.WithoutCancel(r.Context()), owner, id)
	if err != nil {
		return err
	}
	writeJSON(w, status, s.view(sb))
	return nil
}

// view converts the service's record to the wire form.
func (s *Server) view(o manager.OwnedSandbox) client.Sandbox {
	var rec record
	_ = json.Unmarshal(o.Spec, &rec)
	sb := client.Sandbox{
		ID: o.ID, Generation: o.Generation, Template: rec.Spec.RootFS.Template, Labels: o.Labels, CreatedAt: o.CreatedAt,
		Resources: client.SandboxResources{CPUMillis: rec.Spec.Resources.CPUMillis, MemoryBytes: rec.Spec.Resources.MemoryBytes,
			DiskBytes: rec.Spec.Resources.DiskBytes, PIDs: rec.Spec.Resources.PIDs},
		EndsAt: o.Deadline, Reason: o.Reason, Exit: viewExit(o.Exit),
	}
	if sb.Labels == nil {
		sb.Labels = map[string]string{}
	}
	for _, v := range rec.Spec.Volumes {
		sb.Volumes = append(sb.Volumes, client.VolumeMount{ID: v.ID, Path: v.Path})
	}
	switch st := api.SandboxState(o.State); {
	case st == api.StateFailed || st == api.StateLost:
		sb.State = client.StateFailed
		if sb.Reason == "" {
			sb.Reason = stateReason(o.StateReason)
		}
	case st == api.StateReleased && o.Paused && o.Active:
		sb.State = client.StatePaused
	case st == api.StateReleased:
		sb.State = client.StateDestroyed
	case !o.Active:
		sb.State = client.StateFailed
	case st == "" || st == api.StateClaiming:
		sb.State = client.StateCreating
	case st == api.StateReady:
		sb.State = client.StateReady
	case st == api.StateExited:
		sb.State = client.StateExited
	default:
		sb.State = client.StateReleasing
	}
	return sb
}

// stateReason is what a caller reads of the manager's reason for a
// failed generation the service has not ended in its own words (yet, or
// ever: a failed resume): the "kind: message" of the node's refusal,
// classified as an answer would be, so internal detail stays in the log.
func stateReason(stored string) string {
	kind, msg, ok := strings.Cut(stored, ": ")
	err := error(errdefs.Errorf(errdefs.Code(kind), "%s", msg))
	if !ok || codeOfKind[errdefs.Code(kind)] == "" {
		err = errors.New(stored)
	}
	_, text, _ := classify(err)
	return "failed: " + text
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, owner string) error {
	o, err := s.owned(r, owner)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.view(o))
	return nil
}

const (
	defaultPage = 50
	maxPage     = 200
)

func (s *Server) list(w http.ResponseWriter, r *http.Request, owner string) error {
	q := r.URL.Query()
	limit := defaultPage
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPage {
			return invalidf("limit must be 1 to %d", maxPage)
		}
		limit = n
	}
	state := q.Get("state")
	if state != "" && !slices.Contains([]string{client.StateCreating, client.StateReady, client.StatePaused, client.StateReleasing, client.StateDestroyed, client.StateFailed, client.StateExited}, state) {
		return invalidf("unknown state %s", errdefs.Quote(state))
	}
	want := map[string]string{}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || !labelKey.MatchString(k) {
			return invalidf("label filter %s: want KEY=VALUE", errdefs.Quote(l))
		}
		want[k] = v
	}
	after := ""
	if c := q.Get("cursor"); c != "" {
		b, err := base64.RawURLEncoding.DecodeString(c)
		if err != nil || checkID(string(b)) != nil {
			return invalidf("bad cursor")
		}
		after = string(b)
	}
	out := client.SandboxList{Sandboxes: []client.Sandbox{}}
	for {
		batch, err := s.Store.OwnedSandboxes(r.Context(), owner, after, 100)
		if err != nil {
			return err
		}
		for _, o := range batch {
			after = o.ID
			v := s.view(o)
			if (state != "" && v.State != state) || !hasLabels(v.Labels, want) {
				continue
			}
			out.Sandboxes = append(out.Sandboxes, v)
			if len(out.Sandboxes) == limit {
				out.NextCursor = base64.RawURLEncoding.EncodeToString([]byte(o.ID))
				writeJSON(w, http.StatusOK, out)
				return nil
			}
		}
		if len(batch) < 100 {
			break
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

func proofOf(v manager.Verdict) client.Proof {
	p := client.Proof{
		OperationID: v.OperationID, NodeID: v.NodeID, Generation: v.Generation, Verified: v.Verified, Clean: v.Clean,
		Reason: v.Reason, FailedChecks: v.FailedChecks, Signature: v.Proof.Signature, Checks: []client.ProofCheck{},
	}
	for _, c := range v.Proof.Checks {
		p.Checks = append(p.Checks, client.ProofCheck{Name: c.Name, OK: c.OK, Detail: c.Detail})
	}
	return p
}

func (s *Server) destroy(w http.ResponseWriter, r *http.Request, owner string) error {
	o, err := s.owned(r, owner)
	if err != nil {
		return err
	}
	if !o.Active && o.State != string(api.StateReleased) {
		return errorf(client.CodeConflict, "sandbox "+o.ID+" failed to start; nothing of it runs")
	}
	lease := s.opLease(r, leaseDestroy, owner, o.ID)
	if err := s.holdLease(r.Context(), lease); err != nil {
		return err
	}
	ctx := context.WithoutCancel(r.Context())
	// Settled unless a release the node did not answer is pending: then a
	// sweeper completes it with its operation id.
	defer func() {
		pending, err := s.releasePending(ctx, o.ID)
		s.letGoOf(ctx, r, lease.ID, err == nil && !pending)
	}()
	res, err := s.Manager.Destroy(r.Context(), o.ID)
	if err != nil {
		return err
	}
	// Fail closed: the owner's share comes back only with a verified,
	// clean proof; an unproven cleanup keeps it taken (the answer carries
	// the verdict).
	if res.Verdict.OK() {
		if err := s.Store.EndOwnedSandbox(ctx, o.ID, "destroyed"); err != nil {
			return err
		}
		if o.Active {
			s.emit(owner, o.ID, client.EventDestroyed, "destroyed")
		}
	} else {
		s.log().Warn("sandbox released but its cleanup is unproven: its quota share stays taken", "sandbox", o.ID, "reason", res.Verdict.Reason, "failed_checks", res.Verdict.FailedChecks)
	}
	if o, err = s.Store.OwnedSandbox(ctx, owner, o.ID); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, client.DestroyResult{Sandbox: s.view(o), Proof: proofOf(res.Verdict)})
	return nil
}

func userOf(u *client.User) *api.User {
	if u == nil {
		return nil
	}
	return &api.User{UID: u.UID, GID: u.GID}
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request, owner string) error {
	o, err := s.owned(r, owner)
	if err != nil {
		return err
	}
	var req client.ExecRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	env, err := runEnv(req.TimeoutSec, req.Env)
	if err != nil {
		return err
	}
	ereq := api.ExecRequest{Args: req.Args, Env: env, Cwd: req.Cwd, Stdin: req.Stdin, TimeoutSec: req.TimeoutSec, User: userOf(req.User)}
	if err := ereq.Validate(); err != nil {
		return err
	}
	return s.answerRun(w, r, func(stdout, stderr io.Writer) (int, error) {
		return s.Manager.Exec(r.Context(), o.ID, ereq, stdout, stderr)
	})
}

// capped keeps the first limit bytes written to it.
type capped struct {
	b     []byte
	limit int64
	cut   bool
}

func (c *capped) Write(p []byte) (int, error) {
	room := c.limit - int64(len(c.b))
	if int64(len(p)) > room {
		c.b = append(c.b, p[:max(room, 0)]...)
		c.cut = true
	} else {
		c.b = append(c.b, p...)
	}
	return len(p), nil
}

// sse writes server-sent events, flushing each.
type sse struct {
	mu sync.Mutex
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (e *sse) comment(text string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := fmt.Fprintf(e.w, ": %s\n\n", text); err != nil {
		return err
	}
	return e.rc.Flush()
}

func (e *sse) event(name string, data []byte) error {
	return e.eventID(name, "", data)
}

// eventID writes an event with an id (the cursor a reconnecting follower
// sends back as Last-Event-ID); "" writes none.
func (e *sse) eventID(name, id string, data []byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	idLine := ""
	if id != "" {
		idLine = "id: " + id + "\n"
	}
	if _, err := fmt.Fprintf(e.w, "event: %s\n%sdata: %s\n\n", name, idLine, data); err != nil {
		return err
	}
	return e.rc.Flush()
}

type sseStream struct {
	e    *sse
	name string
}

func (s sseStream) Write(p []byte) (int, error) {
	if err := s.e.event(s.name, []byte(base64.StdEncoding.EncodeToString(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// filePath checks a guest path: absolute and clean (no "." or ".."
// components), so what the caller names is what the guest opens.
func filePath(p string) (string, error) {
	if err := api.ValidateFilePath(p); err != nil {
		return "", err
	}
	if path.Clean(p) != p || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") {
		return "", invalidf("path %s is not clean: no \".\" or \"..\" components, no trailing or double slashes", errdefs.Quote(p))
	}
	return p, nil
}

func (s *Server) ownedPath(r *http.Request, owner string) (string, string, error) {
	o, err := s.owned(r, owner)
	if err != nil {
		return "", "", err
	}
	p, err := filePath(r.URL.Query().Get("path"))
	return o.ID, p, err
}

// lazyWriter sends the header on the first byte, so a read that fails
// before any data still gets a JSON error.
type lazyWriter struct {
	w       http.ResponseWriter
	started bool
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", "application/octet-stream")
		l.w.WriteHeader(http.StatusOK)
	}
	return l.w.Write(p)
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request, owner string) error {
	id, p, err := s.ownedPath(r, owner)
	if err != nil {
		return err
	}
	lw := &lazyWriter{w: w}
	if _, err := s.Manager.ReadFileTo(r.Context(), id, p, nil, lw); err != nil {
		if lw.started {
			s.log().Warn("file read failed after its start", "sandbox", id, "err", err)
			return nil
		}
		return err
	}
	if !lw.started {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
	}
	return nil
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request, owner string) error {
	id, p, err := s.ownedPath(r, owner)
	if err != nil {
		return err
	}
	limit := orDefault(s.MaxFileBytes, DefaultMaxFileBytes)
	switch {
	case r.ContentLength < 0:
		return invalidf("a file upload needs a Content-Length")
	case r.ContentLength > limit:
		return errorf(client.CodePayloadTooLarge, fmt.Sprintf("file larger than %d bytes", limit))
	}
	s.bodyDeadline(w, orDefault(s.BodyTimeout, DefaultBodyTimeout)+time.Duration(r.ContentLength/minUploadRate)*time.Second)
	body := http.MaxBytesReader(w, r.Body, limit)
	if err := s.Manager.WriteFileFrom(r.Context(), id, p, nil, 0o644, body, r.ContentLength); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func fileInfo(fi api.FileInfo) client.FileInfo {
	return client.FileInfo{Name: fi.Name, Size: fi.Size, Mode: fi.Mode, MTime: fi.ModUnix, UID: fi.UID, GID: fi.GID,
		IsDir: fi.Mode&(1<<31) != 0, Link: fi.Link}
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request, owner string) error {
	id, p, err := s.ownedPath(r, owner)
	if err != nil {
		return err
	}
	fis, err := s.Manager.ListDir(r.Context(), id, p, nil)
	if err != nil {
		return err
	}
	out := client.FileList{Entries: []client.FileInfo{}}
	for _, fi := range fis {
		out.Entries = append(out.Entries, fileInfo(fi))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request, owner string) error {
	id, p, err := s.ownedPath(r, owner)
	if err != nil {
		return err
	}
	fi, err := s.Manager.StatFile(r.Context(), id, p, nil)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, fileInfo(fi))
	return nil
}

// fileOp is a files call with a JSON body and no answer body.
func fileOp[T any](s *Server, w http.ResponseWriter, r *http.Request, owner string, paths func(*T) []*string, call func(ctx context.Context, id string, req T) error) error {
	o, err := s.owned(r, owner)
	if err != nil {
		return err
	}
	var req T
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	for _, p := range paths(&req) {
		if *p, err = filePath(*p); err != nil {
			return err
		}
	}
	if err := call(r.Context(), o.ID, req); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request, owner string) error {
	return fileOp(s, w, r, owner, func(q *client.MkdirRequest) []*string { return []*string{&q.Path} },
		func(ctx context.Context, id string, q client.MkdirRequest) error {
			return s.Manager.MakeDir(ctx, id, q.Path, 0o755, q.Parents, nil)
		})
}

func (s *Server) remove(w http.ResponseWriter, r *http.Request, owner string) error {
	return fileOp(s, w, r, owner, func(q *client.RemoveRequest) []*string { return []*string{&q.Path} },
		func(ctx context.Context, id string, q client.RemoveRequest) error {
			return s.Manager.RemoveFile(ctx, id, q.Path, q.Recursive, nil)
		})
}

func (s *Server) move(w http.ResponseWriter, r *http.Request, owner string) error {
	return fileOp(s, w, r, owner, func(q *client.MoveRequest) []*string { return []*string{&q.From, &q.To} },
		func(ctx context.Context, id string, q client.MoveRequest) error {
			return s.Manager.RenameFile(ctx, id, q.From, q.To, nil)
		})
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, owner string) error {
	o, err := s.owned(r, owner)
	if err != nil {
		return err
	}
	var req client.TimeoutRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	maxT := orDefault(s.MaxTimeout, DefaultMaxTimeout)
	if req.TimeoutSec < 1 || time.Duration(req.TimeoutSec)*time.Second > maxT {
		return invalidf("timeout_sec must be between 1 and %d", int64(maxT/time.Second))
	}
	if !o.Active {
		return errorf(client.CodeConflict, "sandbox "+o.ID+" has ended")
	}
	if _, err := s.Store.ExtendTimer(r.Context(), o.ID, s.now().Add(time.Duration(req.TimeoutSec)*time.Second)); err != nil {
		return err
	}
	return s.answer(w, r, owner, o.ID, http.StatusOK)
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request, owner string) error {
	o, err := s.owned(r, owner)
	if err != nil {
		return err
	}
	var rec record
	if err := json.Unmarshal(o.Spec, &rec); err != nil {
		return fmt.Errorf("decode the spec of %s: %w", o.ID, err)
	}
	if rec.Spec.RootFS.Mode != api.RootFSBlock {
		return invalidf("sandbox %s has an %s root: only block-mode roots pause (their files are kept); destroy it instead", o.ID, rec.Spec.RootFS.Mode)
	}
	if _, err := s.Manager.Pause(r.Context(), o.ID); err != nil {
		return err
	}
	if err := s.Store.SetPaused(context.WithoutCancel(r.Context()), o.ID, true); err != nil {
		return err
	}
	s.emit(owner, o.ID, client.EventPaused, "")
	return s.answer(w, r, owner, o.ID, http.StatusOK)
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request, owner string) error {
	o, err := s.owned(r, owner)
	if err != nil {
		return err
	}
	if !o.Paused || !o.Active {
		return errorf(client.CodeConflict, "sandbox "+o.ID+" is not paused")
	}
	// A resume is the sandbox's next claim: under its create lease, so a
	// replica that dies in it leaves it to another (replica.go).
	lease := s.opLease(r, leaseCreate, owner, o.ID)
	if err := s.holdLease(r.Context(), lease); err != nil {
		return err
	}
	_, err = s.Manager.Resume(r.Context(), o.ID)
	settled, serr := s.createSettled(r.Context(), owner, o.ID)
	s.letGoOf(r.Context(), r, lease.ID, serr == nil && settled)
	if err != nil {
		return err
	}
	if err := s.Store.SetPaused(context.WithoutCancel(r.Context()), o.ID, false); err != nil {
		return err
	}
	if err := s.Store.RearmIdle(context.WithoutCancel(r.Context()), o.ID, s.now()); err != nil {
		return err
	}
	s.emit(owner, o.ID, client.EventResumed, "")
	return s.answer(w, r, owner, o.ID, http.StatusOK)
}

func (s *Server) templates(w http.ResponseWriter, _ *http.Request, _ string) error {
	out := client.TemplateList{Templates: append([]client.Template{}, s.Templates...)}
	writeJSON(w, http.StatusOK, out)
	return nil
}

var _ io.Writer = (*capped)(nil)

func policyOf(n client.Network) api.NetworkPolicy {
	p := api.NetworkPolicy{Mode: api.NetworkMode(n.Mode)}
	for _, r := range n.Rules {
		p.Rules = append(p.Rules, api.NetworkRule{CIDR: r.CIDR, Domain: r.Domain, Protocol: r.Protocol, Ports: r.Ports})
	}
	return p
}

// setNetwork replaces the running sandbox's egress policy (a live update
// on the node) and answers the policy now in force.
func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request, owner string) error {
	o, err := s.owned(r, owner)
	if err != nil {
		return err
	}
	var req client.Network
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	p := policyOf(req)
	if err := p.Validate(); err != nil {
		return err
	}
	if _, err := s.Manager.UpdateNetwork(r.Context(), o.ID, p); err != nil {
		return err
	}
	if req.Rules == nil {
		req.Rules = []client.NetworkRule{}
	}
	writeJSON(w, http.StatusOK, req)
	return nil
}

// logs answers the main process's output: the whole (or its last tail
// lines) as JSON, or with follow=true an event stream of "log" events
// (base64 chunks) as output comes, then "end" (the reason) or "error".
func (s *Server) logs(w http.ResponseWriter, r *http.Request, owner string) error {
	o, err := s.owned(r, owner)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	var req api.LogsRequest
	for _, p := range []struct {
		name string
		dst  *int64
	}{{"tail", nil}, {"idle_sec", &req.IdleSec}} {
		v := q.Get(p.name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return invalidf("%s must be a number", p.name)
		}
		if p.dst == nil {
			if n < 0 || n > api.MaxLogTailLines {
				return invalidf("tail must be between 0 (all) and %d lines", api.MaxLogTailLines)
			}
			req.Tail = int(n)
		} else {
			*p.dst = n
		}
	}
	switch q.Get("follow") {
	case "", "false":
	case "true":
		req.Follow = true
	default:
		return invalidf("follow must be true or false")
	}
	if err := req.Validate(); err != nil {
		return err
	}
	if !req.Follow {
		buf := &capped{limit: orDefault(s.MaxBodyBytes, DefaultMaxBodyBytes)}
		end, err := s.Manager.Logs(r.Context(), o.ID, req, buf)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, client.LogsResult{Log: buf.b, Truncated: buf.cut, Reason: end.Reason})
		return nil
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	e := &sse{w: w, rc: http.NewResponseController(w)}
	end, err := s.Manager.Logs(r.Context(), o.ID, req, sseStream{e, client.EventLog})
	if err != nil {
		c, msg, _ := classify(err)
		b, _ := json.Marshal(client.ErrorBody{Error: client.ErrorDetail{Code: c, Message: msg}})
		e.event(client.EventError, b)
		return nil
	}
	b, _ := json.Marshal(client.LogsEnd{Reason: end.Reason})
	e.event(client.EventEnd, b)
	return nil
}
