package node

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/guest"
	"github.com/ctld/ctld/internal/node/network"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/node/warm"
	"github.com/ctld/ctld/internal/proof"
)

// The warm pool (docs/architecture.md "Warm pool"): members are whole
// guests booted ahead by the claim table's walk without the policy
// entries (conntrack, nft, dns): lease with the pool's neutral limits,
// disk quota and overlay on the template, netns and veth (a warm carrier
// when there is one; no nft chain dispatches its link, so deny_all),
// agent dir, a bundle with the warm agent, runsc. Each is journaled by a
// record in its own bucket (journal.WarmMember; id and container id
// "warm-<48 random bits in hex>", generation 1; never in the sandboxes
// bucket, and no generation's container id, which all end in "-g<n>"),
// its effect records keyed by that container id. A claim whose warm.KeyFor matches takes the oldest idle
// member in its admitting transaction: the member record goes and its
// effect records are re-keyed to the claim's sandbox and generation,
// whose record then names the member's objects; the claim makes only the
// policy entries, resizes the lease, sets the disk quota and calls the
// agent's claim, whose answer is the readiness proof. A takeover destroys
// every member with a cleanup proof (adoption is not built).

// policyKinds are the entries a member is made without: its claim's.
var policyKinds = []journal.Kind{journal.KindConntrack, journal.KindNft, journal.KindDNS}

// DefaultWarmResources are a member's neutral limits when
// Config.WarmResources is zero (its boot runs at Config.BootCPUMillis).
var DefaultWarmResources = journal.Resources{CPUMillis: 100, MemoryBytes: 128 << 20, PIDs: 64}

// DefaultWarmRefill is the least time between two member boots when
// Config.WarmPool.RefillEvery is zero.
const DefaultWarmRefill = time.Second

// warmIDPrefix starts every member's id and container id: a generation's
// names all end in "-g<generation>", a member's in hex digits.
const warmIDPrefix = "warm-"

// warmPool is the node's state of the warm pool.
type warmPool struct {
	once    sync.Once
	kickCh  chan struct{}
	mu      sync.Mutex
	started bool
	last    time.Time              // when the last member boot started
	fails   int                    // member boots failed in a row
	stats   map[string]*warm.Stats // per template: hits, misses
	// claims counts the claims running on the node and lastClaim is
	// when one last began or ended: the filler boots no member while a
	// claim runs nor within RefillEvery after (claimBegins).
	claims    int
	lastClaim time.Time
}

func (w *warmPool) kick() chan struct{} {
	w.once.Do(func() { w.kickCh = make(chan struct{}, 1) })
	return w.kickCh
}

// warmOn says whether this node keeps a warm pool.
func (n *Node) warmOn() bool {
	for _, v := range n.cfg.WarmPool.Sizes {
		if v > 0 {
			return n.cfg.AgentBinary != ""
		}
	}
	return false
}

// warmResources are a new member's limits.
func (n *Node) warmResources() journal.Resources {
	r := n.cfg.WarmResources
	if r == (journal.Resources{}) {
		r = DefaultWarmResources
	}
	return n.overlay.WithDiskDefault(r)
}

// kickWarm asks the filler to look at the pool (never blocks).
func (n *Node) kickWarm() {
	if !n.warmOn() {
		return
	}
	select {
	case n.warm.kick() <- struct{}{}:
	default:
	}
}

// startWarm starts the term's filler once: it boots and expires members
// as warm.Decide says, one at a time, until the term ends.
func (n *Node) startWarm() {
	if !n.warmOn() {
		return
	}
	n.warm.mu.Lock()
	started := n.warm.started
	n.warm.started = true
	n.warm.mu.Unlock()
	if started {
		return
	}
	kick := n.warm.kick()
	go func() {
		timer := time.NewTimer(0)
		defer timer.Stop()
		for {
			select {
			case <-n.term.Context().Done():
				return
			case <-kick:
			case <-timer.C:
			}
			next, ok := n.warmRound()
			if !ok {
				return
			}
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			if !next.IsZero() {
				timer.Reset(max(time.Until(next), time.Millisecond))
			}
		}
	}()
	n.kickWarm()
}

// warmSettings are the pool's settings with their defaults.
func (n *Node) warmSettings() warm.Settings {
	s := n.cfg.WarmPool
	s.RefillEvery = cmp.Or(s.RefillEvery, DefaultWarmRefill)
	return s
}

// warmRound is one step of the filler as an operation of the term: the
// expiries, then at most one boot. It returns when to look again (zero:
// on a kick) and false once the term is over.
func (n *Node) warmRound() (time.Time, bool) {
	ctx, done, err := n.begin(context.Background())
	if err != nil {
		return time.Time{}, false
	}
	defer done()
	ms, err := n.warmMembers()
	if err != nil {
		n.log.Warn("warm pool: read members", "err", err)
		return time.Now().Add(time.Second), true
	}
	// Read after the members: a claim counts itself before it takes
	// one, so a member gone from ms is a claim this sees.
	n.warm.mu.Lock()
	last, claims, quietAt := n.warm.last, n.warm.claims, n.warm.lastClaim.Add(n.warmSettings().RefillEvery)
	n.warm.mu.Unlock()
	p := warm.Decide(n.warmSettings(), asPoolMembers(ms), last, time.Now(), n.cfg.Versions.Runsc)
	destroyed := 0
	for _, id := range p.Expire {
		for _, m := range ms {
			if m.Rec.ID == id {
				if _, err := n.destroyMember(ctx, m, "expired"); errors.Is(err, errMemberGone) {
					continue // a claim took it first
				} else if err != nil {
					n.log.Warn("warm pool: destroy an expired member", "member", id, "err", err)
				} else {
					destroyed++
				}
			}
		}
	}
	if p.Boot != nil && (claims > 0 || time.Now().Before(quietAt)) {
		// Claims come first: a member boot beside a claim slowed it
		// (in the test VM a warm claim's agent round trip doubled, and
		// back-to-back cold claims with the pool refilling ran at 0.82x
		// of no pool). The last claim's end kicks the filler; the quiet
		// after it is NextAt.
		p.Boot = nil
		if claims == 0 {
			p.NextAt = earliestOf(p.NextAt, quietAt)
		}
	}
	if p.Boot == nil {
		if destroyed > 0 {
			// The expired members held the budget until now: look
			// again for their replacements (a failed destroy waits for
			// the next kick or NextAt, no busy loop).
			return time.Now(), true
		}
		return p.NextAt, true
	}
	n.warm.mu.Lock()
	n.warm.last = time.Now()
	n.warm.mu.Unlock()
	err = n.bootMember(ctx, *p.Boot)
	n.warm.mu.Lock()
	defer n.warm.mu.Unlock()
	if err != nil && n.live() == nil {
		// Back off: RefillEvery doubled per failure in a row, up to a
		// minute, so a broken template or agent costs no busy loop.
		n.warm.fails++
		wait := min(n.warmSettings().RefillEvery<<min(n.warm.fails, 16), time.Minute)
		n.log.Warn("warm pool: member boot failed", "template", p.Boot.Template, "failures", n.warm.fails, "retry_in", wait, "err", err)
		return time.Now().Add(wait), true
	}
	n.warm.fails = 0
	return time.Now(), true // look again: the pool may want more
}

// warmMembers reads the member records.
func (n *Node) warmMembers() ([]journal.WarmMember, error) {
	var ms []journal.WarmMember
	err := n.d.Journal.View(func(tx *journal.Tx) (err error) {
		ms, err = tx.WarmMembers()
		return err
	})
	return ms, err
}

// claimBegins counts a claim running on the node (before it may take a
// member); claimEnds, once it is answered or rolled back, uncounts it and
// kicks the filler.
func (n *Node) claimBegins() {
	n.warm.mu.Lock()
	n.warm.claims++
	n.warm.lastClaim = time.Now()
	n.warm.mu.Unlock()
}

func (n *Node) claimEnds() {
	n.warm.mu.Lock()
	n.warm.claims--
	n.warm.lastClaim = time.Now()
	n.warm.mu.Unlock()
	n.kickWarm()
}

// earliestOf is the earlier of a and b, a zero time being none.
func earliestOf(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// asPoolMembers is the journal's members as warm.Decide sees them: a
// member being removed holds capacity like a booting one and is no
// candidate for anything.
func asPoolMembers(ms []journal.WarmMember) []warm.Member {
	out := make([]warm.Member, 0, len(ms))
	for _, m := range ms {
		st := warm.Booting
		switch m.State {
		case journal.WarmIdle:
			st = warm.Idle
		case journal.WarmRemoving:
			st = warm.Expiring
		}
		out = append(out, warm.Member{ID: m.Rec.ID, Key: memberKey(m), State: st, Since: m.Since})
	}
	return out
}

func memberKey(m journal.WarmMember) warm.Key {
	return warm.Key{Template: m.Rec.RootFS.Template, Mode: rootfsMode(m.Rec), Runsc: m.Runsc}
}

func newMemberID() (string, error) {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("read random member id: %w", err)
	}
	return warmIDPrefix + hex.EncodeToString(b), nil
}

// memberTable is the entries a member is made of: its claim table
// without the policy entries.
func (n *Node) memberTable(rec journal.Sandbox) []entry {
	return slices.DeleteFunc(n.claimTable(rec), func(e entry) bool { return slices.Contains(policyKinds, e.Spec().Kind) })
}

// policyTable is the entries a warm claim makes: the policy entries of
// its claim table.
func (n *Node) policyTable(rec journal.Sandbox) []entry {
	return slices.DeleteFunc(n.claimTable(rec), func(e entry) bool { return !slices.Contains(policyKinds, e.Spec().Kind) })
}

// bootMember journals a new member of pool k as booting, makes it, and
// journals it idle once its agent answered the member's nonce. A member
// that cannot be made is destroyed with a cleanup proof.
func (n *Node) bootMember(ctx context.Context, k warm.Key) error {
	id, err := newMemberID()
	if err != nil {
		return err
	}
	nonce, err := newNonce()
	if err != nil {
		return err
	}
	res := n.warmResources()
	rootfs := journal.RootFS{Mode: journal.RootFSOverlay, Template: k.Template}
	rec := journal.Sandbox{
		ID: id, Generation: 1, State: journal.StateClaiming, ContainerID: id, LeaseID: id, Resources: res, RootFS: rootfs,
		Epoch: n.d.Epoch, CreatedAt: time.Now().UTC(), ClaimOp: "warm-boot-" + id, Nonce: nonce, Netns: id,
		Bundle: n.bundleDir(id), Request: &journal.ClaimRequest{RootFS: rootfs, Resources: res},
		RuntimePIDs: n.cfg.RuntimePIDs, Warm: true,
	}
	lower, err := n.templateDir(k.Template)
	if err != nil {
		return err
	}
	tab := n.memberTable(rec)
	admitted := false
	err = n.d.Journal.Update(func(tx *journal.Tx) error {
		all, err := tx.Holders()
		if err != nil {
			return err
		}
		ms, err := tx.WarmMembers()
		if err != nil {
			return err
		}
		live, err := tx.LiveSandboxes()
		if err != nil {
			return err
		}
		need := rec.Resources
		need.PIDs += rec.RuntimePIDs
		if ok, why := fits(ledger(n.d.Total, n.cfg.Reserve, live, ms), need); !ok {
			n.log.Debug("warm pool: no capacity for a member", "why", why)
			return nil
		}
		if rec.DiskProject, err = n.overlay.AllocDiskProject(all); err != nil {
			return err
		}
		if err := n.net.TakeCarrier(tx, all, &rec); err != nil {
			return err
		}
		if err := tx.PutWarmMember(journal.WarmMember{State: journal.WarmBooting, Runsc: k.Runsc, Since: time.Now().UTC(), Rec: rec}); err != nil {
			return err
		}
		admitted = true
		if len(tab) > 0 {
			return tx.PutEffect(n.run.Intended(tab[0].Spec().Kind, rec))
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, network.ErrCarrierMaking) {
			return nil // the next kick
		}
		return fmt.Errorf("journal a new warm member: %w", err)
	}
	if !admitted {
		return nil
	}
	start := time.Now()
	c := &resource.Claim{Rec: rec, Lower: lower}
	err = n.run.MakeAll(ctx, rec, effects(tab, c), func(journal.Kind, time.Duration) {})
	if err == nil {
		rec = c.Rec
		rec.Root = c.Root
		var got string
		if got, err = n.guest.Ready(ctx, rec); err == nil && got != rec.Nonce {
			err = fmt.Errorf("warm member %s answered another nonce", id)
		}
	}
	if err == nil {
		err = n.d.Journal.Update(func(tx *journal.Tx) error {
			m, ok, err := tx.WarmMember(id)
			if err != nil {
				return err
			}
			if !ok || m.State != journal.WarmBooting {
				return fmt.Errorf("warm member %s is no longer booting", id)
			}
			m.State, m.Since = journal.WarmIdle, time.Now().UTC()
			rec.State = journal.StateReady
			m.Rec = rec
			return tx.PutWarmMember(m)
		})
	}
	if err != nil {
		if n.live() != nil {
			return err // the next primary destroys it
		}
		m := journal.WarmMember{State: journal.WarmBooting, Runsc: k.Runsc, Rec: rec}
		rb, cancel := n.background(2 * time.Minute)
		defer cancel()
		_, derr := n.destroyMember(rb, m, "boot failed: "+err.Error())
		return errors.Join(err, derr)
	}
	n.log.Info("warm member ready", "member", id, "template", k.Template, "ms", time.Since(start).Milliseconds())
	return nil
}

// templateDir is template's directory on this node.
func (n *Node) templateDir(template string) (string, error) {
	return n.lowerDir(template)
}

// destroyMember removes a member's objects (reverse table order, each
// journaled as removing), checks each is gone, signs the cleanup proof
// (operation "warm-destroy-<member>") and journals it; a clean proof
// forgets the member, an unclean one keeps its record withheld (its
// capacity out) for the next takeover.
func (n *Node) destroyMember(ctx context.Context, m journal.WarmMember, reason string) (proof.Proof, error) {
	rec := m.Rec
	opID := "warm-destroy-" + rec.ID
	log := n.log.With("member", rec.ID, "op", opID)
	if err := n.live(); err != nil {
		return proof.Proof{}, err
	}
	if err := n.d.Journal.Update(func(tx *journal.Tx) error {
		cur, ok, err := tx.WarmMember(rec.ID)
		if err != nil {
			return err
		}
		if !ok || cur.State != m.State {
			// A claim took it, or another destroy runs: its objects
			// are not this call's to remove.
			return errMemberGone
		}
		cur.State, cur.Since = journal.WarmRemoving, time.Now().UTC()
		cur.Rec.State = journal.StateReleasing
		rec = cur.Rec
		return tx.PutWarmMember(cur)
	}); err != nil {
		return proof.Proof{}, fmt.Errorf("journal member %s removing: %w", rec.ID, err)
	}
	rec, _ = n.readIdentities(ctx, rec)
	tab := n.tableFor(rec)
	recorded, err := n.effectsOf(rec)
	if err != nil {
		return proof.Proof{}, fmt.Errorf("read effect records of member %s: %w", rec.ID, err)
	}
	steps, errs, over := n.removeRecordedAll(ctx, tab, rec, recorded)
	if over != nil {
		return proof.Proof{}, errors.Join(append(errs, over)...)
	}
	p := n.checkGone(ctx, tab, rec, opID, recorded, steps)
	if err := proof.Sign(n.d.Identity, &p); err != nil {
		errs = append(errs, fmt.Errorf("sign proof: %w", err))
	}
	if err := n.live(); err != nil {
		return proof.Proof{}, errors.Join(append(errs, err)...)
	}
	err = n.d.Journal.Update(func(tx *journal.Tx) error {
		if err := tx.PutProof(p); err != nil {
			return err
		}
		if !p.Clean {
			cur, ok, err := tx.WarmMember(rec.ID)
			if err != nil || !ok {
				return err
			}
			cur.Rec.Withheld = true
			cur.Rec.Reason = reason + "; cleanup unproven: " + failedChecks(p)
			return tx.PutWarmMember(cur)
		}
		for _, r := range n.table.All() {
			if err := tx.DeleteEffect(r.Spec().Kind, rec.ContainerID); err != nil {
				return err
			}
		}
		return tx.DeleteWarmMember(rec.ID)
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("journal cleanup proof: %w", err))
	}
	if !p.Clean {
		errs = append(errs, fmt.Errorf("cleanup unproven: %s", failedChecks(p)))
	}
	if len(errs) == 0 {
		log.Info("warm member destroyed", "reason", reason)
	}
	n.kickCarriers()
	return p, errors.Join(errs...)
}

// errMemberGone: the member a destroy was asked for was taken by a claim
// or changed state since the caller read it.
var errMemberGone = errors.New("warm member taken or changed since it was read")

// displaceMember, for claim rec refused for capacity, destroys the oldest
// idle warm member with a cleanup proof, if rec would fit without the
// idle members: a pool never refuses a claim the node without it would
// admit (a fleet manager may have placed the claim before the member
// booted), and a claim too big for the node anyway costs the pool
// nothing. It reports whether the caller should try to admit rec again;
// the caller, a running claim, holds member boots back (claimBegins).
func (n *Node) displaceMember(ctx context.Context, log *slog.Logger, rec journal.Sandbox) bool {
	var ms []journal.WarmMember
	var live []journal.Sandbox
	if err := n.d.Journal.View(func(tx *journal.Tx) (err error) {
		if ms, err = tx.WarmMembers(); err != nil {
			return err
		}
		live, err = tx.LiveSandboxes()
		return err
	}); err != nil {
		log.Warn("warm pool: read members to displace one", "err", err)
		return false
	}
	var pick *journal.WarmMember
	for i, m := range ms {
		if m.State == journal.WarmIdle && !m.Rec.Withheld && (pick == nil || m.Since.Before(pick.Since)) {
			pick = &ms[i]
		}
	}
	if pick == nil {
		return false
	}
	live = slices.DeleteFunc(live, func(s journal.Sandbox) bool { return s.ID == rec.ID && s.Generation == rec.Generation })
	stay := slices.DeleteFunc(slices.Clone(ms), func(m journal.WarmMember) bool { return m.State == journal.WarmIdle && !m.Rec.Withheld })
	need := rec.Resources
	need.PIDs += rec.RuntimePIDs
	if ok, _ := fits(ledger(n.d.Total, n.cfg.Reserve, live, stay), need); !ok {
		return false
	}
	log.Info("claim displaces a warm member to fit", "member", pick.Rec.ID, "template", pick.Rec.RootFS.Template)
	_, err := n.destroyMember(ctx, *pick, "displaced by a claim")
	if errors.Is(err, errMemberGone) {
		return true // taken meanwhile: look again
	}
	if err != nil {
		log.Warn("warm pool: destroy a displaced member", "member", pick.Rec.ID, "err", err)
		return false
	}
	return true
}

// destroyMembers, on a takeover, destroys every member the journal has
// with a cleanup proof: adopting idle ones is not built yet.
func (n *Node) destroyMembers(ctx context.Context) error {
	ms, err := n.warmMembers()
	if err != nil {
		return fmt.Errorf("read warm members: %w", err)
	}
	var errs []error
	for _, m := range ms {
		n.log.Info("destroying a warm member found on takeover", "member", m.Rec.ID, "state", m.State)
		if _, err := n.destroyMember(ctx, m, "takeover"); err != nil {
			errs = append(errs, fmt.Errorf("warm member %s: %w", m.Rec.ID, err))
		}
	}
	return errors.Join(errs...)
}

// takeWarm, inside a claim's admitting transaction, gives rec an idle
// member of its pool if there is one: the member record goes, its effect
// records are re-keyed to rec's sandbox and generation, and rec names its
// objects. It reports the member taken ("" none) and whether the claim
// was one the pool serves (for the hit and miss counts).
func (n *Node) takeWarm(tx *journal.Tx, rec *journal.Sandbox) (string, bool, error) {
	if !n.warmOn() || n.cfg.WarmPool.Sizes[rec.RootFS.Template] <= 0 {
		return "", false, nil
	}
	req := rec.Request
	_, why := warm.KeyFor(warm.Claim{
		Template: rec.RootFS.Template, Mode: rootfsMode(*rec), Volumes: req != nil && len(req.Volumes) > 0,
		MemoryBytes: rec.Resources.MemoryBytes, MemberMemory: n.warmResources().MemoryBytes,
	}, n.cfg.Versions.Runsc)
	if why != "" {
		return "", false, nil
	}
	k := warm.Key{Template: rec.RootFS.Template, Mode: journal.RootFSOverlay, Runsc: n.cfg.Versions.Runsc}
	ms, err := tx.WarmMembers()
	if err != nil {
		return "", true, err
	}
	pick, ok := warm.Take(asPoolMembers(ms), k)
	if !ok {
		return "", true, nil
	}
	var m journal.WarmMember
	for _, x := range ms {
		if x.Rec.ID == pick.ID {
			m = x
		}
	}
	if err := tx.DeleteWarmMember(m.Rec.ID); err != nil {
		return "", true, err
	}
	for _, r := range n.table.All() {
		e, ok, err := tx.Effect(r.Spec().Kind, m.Rec.ContainerID)
		if err != nil {
			return "", true, err
		}
		if !ok || e.SandboxID != m.Rec.ID || e.Generation != m.Rec.Generation {
			continue
		}
		e.SandboxID, e.Generation, e.Epoch = rec.ID, rec.Generation, n.d.Epoch
		if err := tx.PutEffect(e); err != nil {
			return "", true, err
		}
	}
	mr := m.Rec
	rec.ContainerID, rec.LeaseID, rec.Netns, rec.Bundle, rec.Root = mr.ContainerID, mr.LeaseID, mr.Netns, mr.Bundle, mr.Root
	rec.Slot, rec.DiskProject, rec.RootDev = mr.Slot, mr.DiskProject, mr.RootDev
	rec.NetnsDev, rec.NetnsIno, rec.NetnsCookie = mr.NetnsDev, mr.NetnsIno, mr.NetnsCookie
	rec.RuntimePIDs, rec.WarmMember = mr.RuntimePIDs, mr.ID
	return mr.ID, true, nil
}

// countWarm counts a claim of template that the pool serves as a hit
// (took a member) or a miss (went cold).
func (n *Node) countWarm(template string, hit bool) {
	n.warm.mu.Lock()
	defer n.warm.mu.Unlock()
	if n.warm.stats == nil {
		n.warm.stats = map[string]*warm.Stats{}
	}
	s := n.warm.stats[template]
	if s == nil {
		s = &warm.Stats{}
		n.warm.stats[template] = s
	}
	if hit {
		s.Hits++
	} else {
		s.Misses++
	}
}

// WarmPools is each configured pool's state (idle and booting members
// now, hits and misses since the term began), by template.
func (n *Node) WarmPools() (map[string]warm.Stats, error) {
	if !n.warmOn() {
		return map[string]warm.Stats{}, nil
	}
	ms, err := n.warmMembers()
	if err != nil {
		return nil, err
	}
	return n.warmPoolsOf(ms), nil
}

// warmPoolsOf is WarmPools over the member records ms.
func (n *Node) warmPoolsOf(ms []journal.WarmMember) map[string]warm.Stats {
	out := map[string]warm.Stats{}
	if !n.warmOn() {
		return out
	}
	n.warm.mu.Lock()
	for tpl, size := range n.cfg.WarmPool.Sizes {
		if size <= 0 {
			continue
		}
		var s warm.Stats
		if p := n.warm.stats[tpl]; p != nil {
			s = *p
		}
		out[tpl] = s
	}
	n.warm.mu.Unlock()
	for _, m := range ms {
		s, ok := out[m.Rec.RootFS.Template]
		if !ok {
			continue
		}
		switch m.State {
		case journal.WarmIdle:
			s.Idle++
		case journal.WarmBooting:
			s.Booting++
		}
		out[m.Rec.RootFS.Template] = s
	}
	return out
}

// runWarmClaim makes a warm claim's generation ready: its policy entries,
// its lease's limits, its disk quota, then the agent's claim, whose answer
// is the readiness proof.
func (n *Node) runWarmClaim(ctx context.Context, rec journal.Sandbox) (journal.Sandbox, error) {
	t := journal.Timings{AdmitMS: rec.Timings.AdmitMS}
	phase := n.table.Phases(&t)
	start := time.Now()
	c := &resource.Claim{Rec: rec, Root: rec.Root}
	err := n.run.MakeAll(ctx, rec, effects(n.policyTable(rec), c), func(kind journal.Kind, took time.Duration) {
		d := ms(took)
		t.Steps = append(t.Steps, journal.StepTiming{Resource: string(kind), MakeMS: d})
		if p := phase[kind]; p != nil {
			*p += d
		}
	})
	if err != nil {
		return journal.Sandbox{}, &warmClaimError{err}
	}
	step := time.Now()
	spec := guest.LeaseSpec(rec.LeaseID, rec.Resources, 0, rec.RuntimePIDs)
	if err := n.d.Guest.Leases.Resize(ctx, spec); err != nil {
		return journal.Sandbox{}, &warmClaimError{fmt.Errorf("resize the warm member's lease: %w", err)}
	}
	t.LeaseMS += ms(time.Since(step))
	step = time.Now()
	if err := n.overlay.Relimit(ctx, rec); err != nil {
		return journal.Sandbox{}, &warmClaimError{err}
	}
	t.RootFSMS += ms(time.Since(step))
	step = time.Now()
	nonce, err := n.guest.WarmClaim(ctx, rec) // bounded: guest.WarmClaimTimeout
	if err != nil {
		return journal.Sandbox{}, &warmClaimError{err}
	}
	return n.acceptReadiness(Readiness{SandboxID: rec.ID, Generation: rec.Generation, ContainerID: rec.ContainerID, Nonce: nonce}, func(s *journal.Sandbox) {
		t.ProofMS = ms(time.Since(step))
		t.TotalMS = ms(time.Since(start))
		s.Timings = t
	})
}

// warmClaimError is a warm claim's failure before its readiness was
// published: the claim may fall back to a cold one (warmFallback).
type warmClaimError struct{ err error }

func (e *warmClaimError) Error() string { return "warm claim: " + e.err.Error() }
func (e *warmClaimError) Unwrap() error { return e.err }

// warmFallback, after claim rec's warm member failed its claim (cause),
// destroys the member's objects, which rec names now, with the ordinary
// removal walk and a signed cleanup proof (operation
// "warm-destroy-<member>"), then re-admits rec's generation as the cold
// claim cold (the claim's record before it took the member) with a fresh
// nonce, in place of rec's record. It returns the cold record and true,
// or rec, false and the error when it could not (an unclean proof, the
// term's end, the record changed): the caller then rolls rec back as any
// failed claim.
func (n *Node) warmFallback(ctx context.Context, log *slog.Logger, rec, cold journal.Sandbox, member string, cause error) (journal.Sandbox, bool, error) {
	start := time.Now()
	log.Warn("warm member failed its claim; destroying it and claiming cold", "member", member, "err", cause)
	fail := func(err error) (journal.Sandbox, bool, error) {
		return rec, false, errors.Join(&warmClaimError{cause}, err)
	}
	// The removal runs to its end even if the caller goes away (as a
	// rollback would), within the term.
	rb, cancel := n.background(2 * time.Minute)
	defer cancel()
	cur, err := n.sandbox(rec.ID)
	if err != nil {
		return fail(err)
	}
	if cur.Generation != rec.Generation || cur.State != journal.StateClaiming || cur.WarmMember != member {
		return fail(fmt.Errorf("sandbox %s changed while its warm claim ran (generation %d, %s)", rec.ID, cur.Generation, cur.State))
	}
	cur = n.identify(rb, cur)
	opID := "warm-destroy-" + member
	tab := n.tableFor(cur)
	recorded, err := n.effectsOf(cur)
	if err != nil {
		return fail(fmt.Errorf("read effect records of member %s: %w", member, err))
	}
	steps, errs, over := n.removeRecordedAll(rb, tab, cur, recorded)
	if over != nil {
		return fail(errors.Join(append(errs, over)...))
	}
	p := n.checkGone(rb, tab, cur, opID, recorded, steps)
	if err := proof.Sign(n.d.Identity, &p); err != nil {
		return fail(fmt.Errorf("sign the member's proof: %w", err))
	}
	if err := n.live(); err != nil {
		return fail(err)
	}
	// The proof, and on a clean one the end of the effect records: the
	// record still names the member's slot and disk project, so nothing
	// else takes them until the cold admission below replaces it; an
	// unclean one keeps them for the claim's ordinary rollback.
	if err := n.d.Journal.Update(func(tx *journal.Tx) error {
		if err := tx.PutProof(p); err != nil {
			return err
		}
		if !p.Clean {
			return nil
		}
		for _, r := range n.table.All() {
			if err := tx.DeleteEffect(r.Spec().Kind, cur.ContainerID); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fail(fmt.Errorf("journal the member's cleanup proof: %w", err))
	}
	if !p.Clean {
		return fail(errors.Join(append(errs, fmt.Errorf("member %s: cleanup unproven: %s", member, failedChecks(p)))...))
	}
	log.Info("warm member destroyed", "member", member, "proof_op", opID, "reason", "claim failed")
	n.kickCarriers()

	nonce, err := newNonce()
	if err != nil {
		return fail(err)
	}
	cold.Nonce = nonce
	cold.Timings.AdmitMS = rec.Timings.AdmitMS
	var bound <-chan time.Time
	for {
		var making bool
		changed := n.net.CarrierChanges()
		next := cold
		err = n.d.Journal.Update(func(tx *journal.Tx) error {
			s, ok, err := tx.Sandbox(rec.ID)
			if err != nil {
				return err
			}
			if !ok || s.Generation != rec.Generation || s.State != journal.StateClaiming || s.WarmMember != member {
				return errdefs.Errorf(errdefs.CodeFenced, "sandbox %s changed while its warm member was destroyed", rec.ID)
			}
			// Over every holder but the record this one replaces.
			holders, err := tx.Holders()
			if err != nil {
				return err
			}
			holders = slices.DeleteFunc(holders, func(h journal.Sandbox) bool { return h.ID == s.ID && h.Generation == s.Generation })
			if making, err = n.allocCold(tx, holders, &next); err != nil {
				return err
			}
			if err := n.admitFits(tx, next); err != nil {
				return err
			}
			return n.intendFirst(tx, next)
		})
		if !making {
			break
		}
		if bound == nil {
			t := time.NewTimer(n.net.CarrierWait())
			defer t.Stop()
			bound = t.C
		}
		select {
		case <-changed:
			continue
		case <-bound:
		case <-ctx.Done():
		}
		break
	}
	if err != nil {
		return fail(fmt.Errorf("admit the cold claim after the warm member: %w", err))
	}
	log.Info("claim falls back to cold", "member", member, "fallback_ms", ms(time.Since(start)))
	cur, err = n.sandbox(rec.ID)
	if err != nil {
		return fail(err)
	}
	return cur, true, nil
}
