// Package nft is ctld's firewall: one nftables table (inet ctld) with base
// chains that dispatch each sandbox link through a verdict map to its
// generation's chain, sets and named counters (docs/network-design.md,
// section 4). Everything goes through google/nftables over netlink; every
// change is one transaction (one Flush), so the kernel holds the old
// objects or the new ones, never a mix. What is loaded is rendered as
// plain data first (render.go).
package nft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/netpolicy"
)

// Firewall is the node's nft table. Its methods may be called
// concurrently: each opens its own netlink socket and sends its own batch.
type Firewall struct {
	cfg Config
	log *slog.Logger
}

// New checks cfg and returns the firewall; it touches nothing.
func New(cfg Config, logger *slog.Logger) (*Firewall, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	return &Firewall{cfg: cfg, log: logging.OrDiscard(logger)}, nil
}

func (f *Firewall) table() *nftables.Table {
	return &nftables.Table{Name: f.cfg.table(), Family: nftables.TableFamilyINet}
}

func (f *Firewall) conn() (*nftables.Conn, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("open nftables netlink: %w", err)
	}
	return c, nil
}

// Ensure makes the table, its base chains and its maps if missing or of
// another version, without touching any generation's objects.
func (f *Firewall) Ensure(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	base := RenderBase(f.cfg)
	c, err := f.conn()
	if err != nil {
		return err
	}
	current, err := f.baseCurrent(c, base)
	if err != nil {
		return err
	}
	if current {
		return nil
	}
	srcEls, err := f.srcElements(c)
	if err != nil {
		return err
	}
	t := f.table()
	c.AddTable(t)
	for _, s := range base.Sets {
		spec := s.Spec
		spec.Table = t
		if err := c.AddSet(&spec, nil); err != nil {
			return fmt.Errorf("ensure nft set %s: %w", spec.Name, err)
		}
	}
	for _, ch := range base.Chains {
		spec := ch.Spec
		spec.Table = t
		c.AddChain(&spec)
		// Adding a chain that exists keeps its rules: replace them
		// in the same transaction, so the hook never sees a mix.
		c.FlushChain(&spec)
		for _, r := range ch.Rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: &spec, Exprs: r.Exprs, UserData: comment(r.Comment)})
		}
	}
	migrated := 0
	for set, els := range srcEls {
		if err := c.SetAddElements(&nftables.Set{Table: t, Name: set, IsMap: true}, els); err != nil {
			return fmt.Errorf("ensure nft %s elements: %w", set, err)
		}
		migrated += len(els)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("ensure nft table %s: %w", t.Name, err)
	}
	f.log.Info("nft table ensured", "table", t.Name, "version", base.Version, "src elements added", migrated)
	return nil
}

// srcElements are the src4/src6 elements of every generation that has a
// dns4/dns6 element: a table made before base v4 has none, and without
// them the new input rule would drop those sandboxes' DNS. The key and
// the mark follow from the link's slot and the pool; Ensure adds them in
// its transaction (adding an element that is there already is not an
// error). Nothing when the table or the dns sets do not exist yet.
func (f *Firewall) srcElements(c *nftables.Conn) (map[string][]nftables.SetElement, error) {
	t := f.table()
	if ok, err := f.tableExists(c); err != nil || !ok {
		return nil, err
	}
	sets, err := c.GetSets(t)
	if err != nil {
		return nil, fmt.Errorf("list nft sets of %s: %w", t.Name, err)
	}
	out := map[string][]nftables.SetElement{}
	for _, m := range []struct{ dns, src string }{{SetDNS4, MapSrc4}, {SetDNS6, MapSrc6}} {
		if !slices.ContainsFunc(sets, func(s *nftables.Set) bool { return s.Name == m.dns }) {
			continue
		}
		els, err := c.GetSetElements(&nftables.Set{Table: t, Name: m.dns})
		if err != nil {
			return nil, fmt.Errorf("list nft %s elements: %w", m.dns, err)
		}
		for _, e := range els {
			link := linkOfKey(e.Key)
			slot, ok := netpolicy.ParseLinkName(link)
			if !ok {
				continue
			}
			b, err := f.cfg.Pool.Block(slot)
			if err != nil {
				continue // outside this pool: not a generation of ours
			}
			for _, k := range linkKeys(b) {
				if k.Set == m.src {
					out[m.src] = append(out[m.src], nftables.SetElement{Key: k.key(link), Val: binaryutil.NativeEndian.PutUint32(uint32(slot))})
				}
			}
		}
	}
	return out, nil
}

// baseCurrent reports whether the table has every base set and chain, and
// each base chain starts with the rule comment of this version.
func (f *Firewall) baseCurrent(c *nftables.Conn, base Base) (bool, error) {
	t := f.table()
	ok, err := f.tableExists(c)
	if err != nil || !ok {
		return false, err
	}
	sets, err := c.GetSets(t)
	if err != nil {
		return false, fmt.Errorf("list nft sets of %s: %w", t.Name, err)
	}
	for _, s := range base.Sets {
		if !slices.ContainsFunc(sets, func(k *nftables.Set) bool { return k.Name == s.Spec.Name }) {
			return false, nil
		}
	}
	for _, ch := range base.Chains {
		exists, err := f.chainExists(ch.Spec.Name)
		if err != nil || !exists {
			return false, err
		}
		rules, err := c.GetRules(t, &nftables.Chain{Name: ch.Spec.Name, Table: t})
		if err != nil {
			return false, fmt.Errorf("list nft rules of %s: %w", ch.Spec.Name, err)
		}
		if len(rules) != len(ch.Rules) || commentOf(rules[0].UserData) != base.Version {
			return false, nil
		}
	}
	return true, nil
}

func (f *Firewall) tableExists(c *nftables.Conn) (bool, error) {
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, fmt.Errorf("list nft tables: %w", err)
	}
	return slices.ContainsFunc(ts, func(t *nftables.Table) bool { return t.Name == f.cfg.table() }), nil
}

// Apply makes or replaces o's objects so they enforce eff, in one
// transaction. A replace keeps the counters, the dispatch element and the
// resolved elements of every domain set whose profile did not change; it
// flushes the chain and the other sets and loads them anew.
func (f *Firewall) Apply(ctx context.Context, o netpolicy.Owner, eff netpolicy.Effective) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	g, err := RenderGeneration(f.cfg, o, eff)
	if err != nil {
		return err
	}
	c, err := f.conn()
	if err != nil {
		return err
	}
	t := f.table()
	chain := &nftables.Chain{Name: g.Chain.Spec.Name, Table: t}
	exists, err := f.chainExists(chain.Name)
	if err != nil {
		return err
	}
	fwd := &nftables.Set{Table: t, Name: MapDispatch}
	found, target, err := f.element(MapDispatch, ifname(g.Link))
	if err != nil {
		return err
	}
	if found && target != chain.Name {
		return errdefs.Errorf(errdefs.CodeConflict, "apply nft objects of %s: link %s dispatches to %s", chain.Name, g.Link, target)
	}
	fwdOurs := found
	if !exists {
		for _, n := range g.Counters {
			c.AddObj(&nftables.CounterObj{Table: t, Name: n})
		}
		for _, s := range g.Sets {
			spec := s.Spec
			spec.Table = t
			if err := c.AddSet(&spec, s.Elements); err != nil {
				return fmt.Errorf("apply nft set %s: %w", spec.Name, err)
			}
		}
		c.AddChain(chain)
	} else {
		old, err := c.GetRules(t, chain)
		if err != nil {
			return fmt.Errorf("list nft rules of %s: %w", chain.Name, err)
		}
		oldSets := setsOfRules(old)
		c.FlushChain(chain)
		for name := range oldSets {
			if !slices.ContainsFunc(g.Sets, func(s Set) bool { return s.Spec.Name == name }) {
				c.DelSet(&nftables.Set{Table: t, Name: name})
			}
		}
		newComments := setsOfRules(g.rules())
		for _, s := range g.Sets {
			spec := s.Spec
			spec.Table = t
			was, ok := oldSets[spec.Name]
			switch {
			case !ok:
				if err := c.AddSet(&spec, s.Elements); err != nil {
					return fmt.Errorf("apply nft set %s: %w", spec.Name, err)
				}
			case spec.HasTimeout && was != "" && was == newComments[spec.Name]:
				// The same domain profile: its resolved answers stay.
			default:
				c.FlushSet(&spec)
				if len(s.Elements) > 0 {
					if err := c.SetAddElements(&spec, s.Elements); err != nil {
						return fmt.Errorf("apply nft set %s: %w", spec.Name, err)
					}
				}
			}
		}
	}
	for _, r := range g.Chain.Rules {
		c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: r.Exprs, UserData: comment(r.Comment)})
	}
	// An element that is there already is not added again: adding a
	// goto makes the kernel validate every chain the table reaches.
	if !fwdOurs {
		if err := c.SetAddElements(fwd, []nftables.SetElement{FwdElement(g.Link, chain.Name)}); err != nil {
			return fmt.Errorf("apply nft dispatch element: %w", err)
		}
	}
	for _, k := range linkKeys(o.Block) {
		s := &nftables.Set{Table: t, Name: k.Set, IsMap: k.Set == MapSrc4 || k.Set == MapSrc6}
		i := slices.IndexFunc(g.Elements, func(e Element) bool { return e.Set == k.Set })
		switch {
		case i >= 0:
			e := g.Elements[i]
			if err := c.SetAddElements(s, []nftables.SetElement{{Key: e.Key, Val: e.Val}}); err != nil {
				return fmt.Errorf("apply nft %s element: %w", k.Set, err)
			}
		case exists:
			// The new policy has no DNS proxy in this family: remove an
			// element the old one had. Add, then delete, so a missing
			// element does not fail the transaction.
			e := []nftables.SetElement{{Key: k.key(g.Link)}}
			if s.IsMap {
				e[0].Val = binaryutil.NativeEndian.PutUint32(g.Mark)
			}
			if err := errors.Join(c.SetAddElements(s, e), c.SetDeleteElements(s, e)); err != nil {
				return fmt.Errorf("apply nft %s element: %w", k.Set, err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("apply nft objects of %s: %w", chain.Name, err)
	}
	f.log.Debug("nft applied", "chain", chain.Name, "replace", exists, "mode", eff.Mode, "sets", len(g.Sets), "rules", len(g.Chain.Rules))
	return nil
}

func (g Generation) rules() []*nftables.Rule {
	var out []*nftables.Rule
	for _, r := range g.Chain.Rules {
		out = append(out, &nftables.Rule{Exprs: r.Exprs, UserData: comment(r.Comment)})
	}
	return out
}

// setsOfRules names the sets the rules look up, each with the comment of
// the (last) rule that looks it up: a domain set's profile.
func setsOfRules(rules []*nftables.Rule) map[string]string {
	out := map[string]string{}
	for _, r := range rules {
		for _, e := range r.Exprs {
			if l, ok := e.(*expr.Lookup); ok {
				out[l.SetName] = commentOf(r.UserData)
			}
		}
	}
	return out
}

// inventory is what the table holds, read in one pass.
type inventory struct {
	chains, sets, counters []string
	fwd                    map[string]string   // link → chain it dispatches to
	linked                 map[string][][]byte // base set → keys that start with a link (linkKeys)
}

func (f *Firewall) inventory(c *nftables.Conn) (inventory, error) {
	inv := inventory{fwd: map[string]string{}, linked: map[string][][]byte{}}
	t := f.table()
	ok, err := f.tableExists(c)
	if err != nil || !ok {
		return inv, err
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return inv, fmt.Errorf("list nft chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table != nil && ch.Table.Name == t.Name {
			inv.chains = append(inv.chains, ch.Name)
		}
	}
	sets, err := c.GetSets(t)
	if err != nil {
		return inv, fmt.Errorf("list nft sets of %s: %w", t.Name, err)
	}
	for _, s := range sets {
		inv.sets = append(inv.sets, s.Name)
	}
	objs, err := c.GetObjects(t)
	if err != nil {
		return inv, fmt.Errorf("list nft objects of %s: %w", t.Name, err)
	}
	for _, o := range objs {
		if co, ok := o.(*nftables.CounterObj); ok {
			inv.counters = append(inv.counters, co.Name)
		}
	}
	for _, name := range append([]string{MapDispatch}, linkedSets()...) {
		if !slices.Contains(inv.sets, name) {
			continue
		}
		els, err := c.GetSetElements(&nftables.Set{Table: t, Name: name})
		if err != nil {
			return inv, fmt.Errorf("list nft %s elements: %w", name, err)
		}
		for _, e := range els {
			link := linkOfKey(e.Key)
			if name == MapDispatch {
				inv.fwd[link] = verdictChain(e.Val)
			} else {
				inv.linked[name] = append(inv.linked[name], e.Key)
			}
		}
	}
	return inv, nil
}

// verdictChain reads the chain of a verdict map element's data (the
// library returns the verdict's nested attributes undecoded).
func verdictChain(b []byte) string {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return ""
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		if ad.Type() == unix.NFTA_VERDICT_CHAIN {
			return ad.String()
		}
	}
	return ""
}

// owned is what of inv belongs to chain: its chain, the sets and counters
// named after it, the dispatch elements that go to it, and the elements
// of those links in the link-keyed base sets (and of link, unless another
// chain owns it).
type owned struct {
	chain           bool
	sets, counters  []string
	fwd             []string  // links
	linked          []Element // in linkedSets (keys only)
	foreignFwdLinks []string
}

func (inv inventory) owned(chain, link string) owned {
	var w owned
	w.chain = slices.Contains(inv.chains, chain)
	for _, s := range inv.sets {
		if strings.HasPrefix(s, chain+".") {
			w.sets = append(w.sets, s)
		}
	}
	for _, n := range inv.counters {
		if strings.HasPrefix(n, chain+".") {
			w.counters = append(w.counters, n)
		}
	}
	links := map[string]bool{}
	for l, ch := range inv.fwd {
		if ch == chain {
			w.fwd = append(w.fwd, l)
			links[l] = true
		}
	}
	slices.Sort(w.fwd)
	if link != "" {
		if ch, ok := inv.fwd[link]; ok && ch != chain {
			w.foreignFwdLinks = append(w.foreignFwdLinks, link+" → "+ch)
		} else {
			links[link] = true
		}
	}
	for _, set := range linkedSets() {
		for _, k := range inv.linked[set] {
			if links[linkOfKey(k)] {
				w.linked = append(w.linked, Element{Set: set, Key: k})
			}
		}
	}
	return w
}

func (w owned) empty() bool {
	return !w.chain && len(w.sets)+len(w.counters)+len(w.fwd)+len(w.linked) == 0
}

func (w owned) String() string {
	var parts []string
	if w.chain {
		parts = append(parts, "chain")
	}
	add := func(what string, xs []string) {
		if len(xs) > 0 {
			parts = append(parts, what+" "+strings.Join(xs, ","))
		}
	}
	add("sets", w.sets)
	add("counters", w.counters)
	add("dispatch elements", w.fwd)
	for _, set := range linkedSets() {
		var xs []string
		for _, e := range w.linked {
			if e.Set == set {
				xs = append(xs, linkOfKey(e.Key))
			}
		}
		add(set+" elements", xs)
	}
	return strings.Join(parts, "; ")
}

// Remove deletes every object of o (dispatch and DNS elements first), in
// one transaction; what is already gone is skipped.
func (f *Firewall) Remove(ctx context.Context, o netpolicy.Owner) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w, err := f.ownedByName(o)
	if err != nil {
		return err
	}
	c, err := f.conn()
	if err != nil {
		return err
	}
	return f.delete(c, o.Chain(), w)
}

// ownedByName finds o's objects by asking for each name and key the
// layout can give them (render.go), so its cost does not grow with the
// number of generations: the chain, the counters, the fixed sets, the
// domain sets d0.. up to the first index with neither family (they are
// made and deleted together, in one transaction), the dispatch element of o's
// link if it dispatches to o's chain, and the dns elements of the link
// unless the link dispatches to another generation. An object outside the
// layout is an orphan for List and RemoveOrphan.
func (f *Firewall) ownedByName(o netpolicy.Owner) (owned, error) {
	chain, link := o.Chain(), o.Link()
	var w owned
	var err error
	if w.chain, err = f.chainExists(chain); err != nil {
		return w, err
	}
	found, target, err := f.element(MapDispatch, ifname(link))
	if err != nil {
		return w, err
	}
	switch {
	case found && target == chain:
		w.fwd = []string{link}
	case found:
		// The link dispatches to another generation: its DNS elements
		// are that generation's too.
		w.foreignFwdLinks = append(w.foreignFwdLinks, link+" → "+target)
		link = ""
	}
	for _, k := range linkKeys(o.Block) {
		if link == "" {
			break
		}
		key := k.key(link)
		ok, _, err := f.element(k.Set, key)
		if err != nil {
			return w, err
		}
		if ok {
			w.linked = append(w.linked, Element{Set: k.Set, Key: key})
		}
	}
	for _, s := range []string{suffixTx, suffixDrop} {
		name := netpolicy.SetName(o.ID, o.Generation, s)
		ok, err := f.counterExists(name)
		if err != nil {
			return w, err
		}
		if ok {
			w.counters = append(w.counters, name)
		}
	}
	probe := func(name string) (bool, error) {
		ok, err := f.setExists(name)
		if ok {
			w.sets = append(w.sets, name)
		}
		return ok, err
	}
	for _, what := range []string{"x4", "x6", "a4", "a6"} {
		if _, err := probe(netpolicy.SetName(o.ID, o.Generation, what)); err != nil {
			return w, err
		}
	}
	for i := 0; ; i++ {
		ok4, err := probe(DomainSetName(o, i, false))
		if err != nil {
			return w, err
		}
		ok6, err := probe(DomainSetName(o, i, true))
		if err != nil {
			return w, err
		}
		if !ok4 && !ok6 {
			break
		}
	}
	return w, nil
}

// RemoveOrphan deletes every object of the generation chain names: what
// the whole table holds under its name, the dispatch elements that go to
// it and the DNS elements of their links.
func (f *Firewall) RemoveOrphan(ctx context.Context, chain string) error {
	id, gen, ok := netpolicy.ParseChainName(chain)
	if !ok || netpolicy.ChainName(id, gen) != chain {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "remove nft orphan %s: not a generation chain name", errdefs.Quote(chain))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := f.conn()
	if err != nil {
		return err
	}
	inv, err := f.inventory(c)
	if err != nil {
		return err
	}
	return f.delete(c, chain, inv.owned(chain, ""))
}

// delete removes w in one transaction: the elements first (they hold the
// chain), then the chain (and its rules, which hold the sets and
// counters), then the sets and counters.
func (f *Firewall) delete(c *nftables.Conn, chain string, w owned) error {
	if w.empty() {
		return nil
	}
	t := f.table()
	if len(w.fwd) > 0 {
		var els []nftables.SetElement
		for _, l := range w.fwd {
			els = append(els, nftables.SetElement{Key: ifname(l)})
		}
		if err := c.SetDeleteElements(&nftables.Set{Table: t, Name: MapDispatch, IsMap: true}, els); err != nil {
			return fmt.Errorf("remove nft dispatch elements of %s: %w", chain, err)
		}
	}
	for _, set := range linkedSets() {
		var els []nftables.SetElement
		for _, e := range w.linked {
			if e.Set == set {
				els = append(els, nftables.SetElement{Key: e.Key})
			}
		}
		if len(els) == 0 {
			continue
		}
		if err := c.SetDeleteElements(&nftables.Set{Table: t, Name: set}, els); err != nil {
			return fmt.Errorf("remove nft %s elements of %s: %w", set, chain, err)
		}
	}
	if w.chain {
		c.DelChain(&nftables.Chain{Table: t, Name: chain})
	}
	for _, s := range w.sets {
		c.DelSet(&nftables.Set{Table: t, Name: s})
	}
	for _, n := range w.counters {
		c.DeleteObject(&nftables.CounterObj{Table: t, Name: n})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove nft objects of %s (%s): %w", chain, w, err)
	}
	f.log.Debug("nft removed", "chain", chain, "objects", w.String())
	return nil
}

// CheckGone is the cleanup proof's check: no chain, set or counter of o,
// no dispatch element for o's link, no dns element of o's link. It reads by
// name and key (ownedByName), at a cost that does not grow with the table.
func (f *Firewall) CheckGone(ctx context.Context, o netpolicy.Owner) (bool, string) {
	if err := ctx.Err(); err != nil {
		return false, err.Error()
	}
	w, err := f.ownedByName(o)
	if err != nil {
		return false, err.Error()
	}
	var left []string
	if !w.empty() {
		left = append(left, w.String())
	}
	if len(w.foreignFwdLinks) > 0 {
		left = append(left, "dispatch element "+strings.Join(w.foreignFwdLinks, ","))
	}
	if len(left) > 0 {
		return false, "nft objects left: " + strings.Join(left, "; ")
	}
	return true, fmt.Sprintf("no nft chain, set, counter or element of %s (%s)", o.Chain(), o.Link())
}

// List names the generations that own any object in the table.
func (f *Firewall) List(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := f.conn()
	if err != nil {
		return nil, err
	}
	inv, err := f.inventory(c)
	if err != nil {
		return nil, err
	}
	var out []string
	add := func(n string) {
		if id, gen, ok := netpolicy.ParseChainName(n); ok {
			out = append(out, netpolicy.ChainName(id, gen))
		}
	}
	for _, xs := range [][]string{inv.chains, inv.sets, inv.counters} {
		for _, n := range xs {
			add(n)
		}
	}
	for _, ch := range inv.fwd {
		add(ch)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Counters reads o's named counters.
func (f *Firewall) Counters(ctx context.Context, o netpolicy.Owner) (netpolicy.Counters, error) {
	if err := ctx.Err(); err != nil {
		return netpolicy.Counters{}, err
	}
	c, err := f.conn()
	if err != nil {
		return netpolicy.Counters{}, err
	}
	t := f.table()
	var out netpolicy.Counters
	for _, s := range []string{suffixTx, suffixDrop} {
		name := netpolicy.SetName(o.ID, o.Generation, s)
		obj, err := c.GetObject(&nftables.CounterObj{Table: t, Name: name})
		if err != nil {
			return out, errdefs.Errorf(errdefs.CodeNotFound, "read nft counter %s: %v", name, err)
		}
		co, ok := obj.(*nftables.CounterObj)
		if !ok {
			return out, fmt.Errorf("read nft counter %s: got %T", name, obj)
		}
		if s == suffixTx {
			out.TxBytes, out.TxPackets = co.Bytes, co.Packets
		} else {
			out.DroppedPackets = co.Packets
		}
	}
	return out, nil
}

// AllowResolved adds addrs to o's domain set number set with the element
// timeout ttl, in one transaction. An address that is already there gets
// the new timeout: the kernel (6.1) keeps an element's old timeout on a
// plain add, so each element is added, deleted and added again in the
// batch, which works whether it existed or not. IPv6 addresses of an
// owner without IPv6 are skipped (all of its IPv6 is dropped anyway).
func (f *Firewall) AllowResolved(ctx context.Context, o netpolicy.Owner, set int, addrs []netip.Addr, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if set < 0 || ttl < time.Millisecond {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "allow resolved addresses for %s: domain set %d, ttl %v", o.Chain(), set, ttl)
	}
	// One element once: deleting it twice in the batch would fail it.
	uniq := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		uniq = append(uniq, a.Unmap().WithZone(""))
	}
	slices.SortFunc(uniq, netip.Addr.Compare)
	uniq = slices.Compact(uniq)
	var v4, v6 []nftables.SetElement
	for _, a := range uniq {
		switch {
		case a.Is4():
			v4 = append(v4, nftables.SetElement{Key: a.AsSlice()})
		case a.Is6() && o.Block.Addr6.IsValid():
			v6 = append(v6, nftables.SetElement{Key: a.AsSlice()})
		}
	}
	if len(v4)+len(v6) == 0 {
		return nil
	}
	c, err := f.conn()
	if err != nil {
		return err
	}
	t := f.table()
	for _, fam := range []struct {
		v6  bool
		els []nftables.SetElement
	}{{false, v4}, {true, v6}} {
		if len(fam.els) == 0 {
			continue
		}
		s := &nftables.Set{Table: t, Name: DomainSetName(o, set, fam.v6), HasTimeout: true}
		timed := slices.Clone(fam.els)
		for i := range timed {
			timed[i].Timeout = ttl
		}
		if err := errors.Join(c.SetAddElements(s, timed), c.SetDeleteElements(s, fam.els), c.SetAddElements(s, timed)); err != nil {
			return fmt.Errorf("allow resolved addresses in %s: %w", s.Name, err)
		}
	}
	if err := c.Flush(); err != nil {
		if errors.Is(err, unix.ENFILE) {
			// The kernel's word for a set at its size.
			return fmt.Errorf("allow resolved addresses for %s set %d: the domain set is full (size %d): %w", o.Chain(), set, f.cfg.domainSetSize(), err)
		}
		return fmt.Errorf("allow resolved addresses for %s set %d: %w", o.Chain(), set, err)
	}
	return nil
}
