package flows

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/netpolicy"
)

// DefaultMask is the part of the ct mark that holds the slot by default:
// the low 20 bits (slots are below netpolicy.MaxSlots = 2^20).
const DefaultMask uint32 = netpolicy.MaxSlots - 1

// maxListed bounds how many remaining flows CheckGone names.
const maxListed = 8

// Conntrack is the real Flows: the kernel's conntrack table over
// ctnetlink (github.com/ti-mo/conntrack). It keeps no state; each call
// opens its own netlink socket.
type Conntrack struct {
	// Mask is the part of the ct mark that holds the slot (zero:
	// DefaultMask); the bits outside it are left to other software on the
	// node. It must be the firewall's mask (nft.Config.MarkMask): a flow's
	// mark is its slot (Mark).
	Mask uint32
	// NetNS is an open fd of the network namespace whose table to use
	// (zero: the caller's, the root netns for ctld; tests pass their own).
	NetNS  int
	Logger *slog.Logger
}

func (c *Conntrack) mask() uint32 {
	if c.Mask == 0 {
		return DefaultMask
	}
	return c.Mask
}

func (c *Conntrack) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

// Mark is the ct mark value of slot under mask: the slot itself, which
// must lie inside mask, as the nft chain sets it (package nft:
// ct mark = (ct mark & ^mask) ^ slot; the bits outside the mask are other
// software's). Slot 0 is refused: its mark is every unmarked flow's, so a
// Flush of slot 0 would delete the whole node's flows.
func Mark(mask uint32, slot netpolicy.Slot) (uint32, error) {
	if slot == 0 || uint32(slot) >= netpolicy.MaxSlots {
		return 0, errdefs.Errorf(errdefs.CodeInvalidArgument, "conntrack slot %d: must be 1..%d", slot, netpolicy.MaxSlots-1)
	}
	if uint32(slot)&^mask != 0 {
		return 0, errdefs.Errorf(errdefs.CodeInvalidArgument, "conntrack slot %d does not fit the mark mask %#x", slot, mask)
	}
	return uint32(slot), nil
}

// filter selects slot's flows: mark & mask == Mark(mask, slot).
func (c *Conntrack) filter(slot netpolicy.Slot) (conntrack.Filter, string, error) {
	m, err := Mark(c.mask(), slot)
	if err != nil {
		return nil, "", err
	}
	return conntrack.NewFilter().Mark(m).MarkMask(c.mask()), fmt.Sprintf("mark %#x/%#x", m, c.mask()), nil
}

func (c *Conntrack) dial() (*conntrack.Conn, error) {
	var cfg *netlink.Config
	if c.NetNS != 0 {
		cfg = &netlink.Config{NetNS: c.NetNS}
	}
	conn, err := conntrack.Dial(cfg)
	if err != nil {
		return nil, fmt.Errorf("dial conntrack netlink: %w", err)
	}
	return conn, nil
}

// dump lists slot's flows.
func (c *Conntrack) dump(ctx context.Context, slot netpolicy.Slot) (*conntrack.Conn, []conntrack.Flow, string, error) {
	f, what, err := c.filter(slot)
	if err != nil {
		return nil, nil, "", err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, "", err
	}
	conn, err := c.dial()
	if err != nil {
		return nil, nil, "", err
	}
	fs, err := conn.DumpFilter(f, nil)
	if err != nil {
		conn.Close()
		return nil, nil, "", fmt.Errorf("dump conntrack flows with %s: %w", what, err)
	}
	return conn, fs, what, nil
}

// Flush deletes every flow of slot (release). Deleting none is success.
func (c *Conntrack) Flush(ctx context.Context, slot netpolicy.Slot) error {
	f, what, err := c.filter(slot)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	conn, err := c.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.FlushFilter(f); err != nil {
		return fmt.Errorf("flush conntrack flows with %s: %w", what, err)
	}
	c.logger().Debug("flushed conntrack flows", "slot", slot, "filter", what)
	return nil
}

// CheckGone is the cleanup proof's check: no flow carries slot's mark.
func (c *Conntrack) CheckGone(ctx context.Context, slot netpolicy.Slot) (ok bool, detail string) {
	conn, fs, what, err := c.dump(ctx, slot)
	if err != nil {
		return false, err.Error()
	}
	conn.Close()
	if len(fs) == 0 {
		return true, "no conntrack flow with " + what
	}
	var names []string
	for i, f := range fs {
		if i == maxListed {
			names = append(names, fmt.Sprintf("and %d more", len(fs)-maxListed))
			break
		}
		names = append(names, tupleOf(f).String())
	}
	return false, fmt.Sprintf("%d conntrack flows with %s remain: %s", len(fs), what, strings.Join(names, ", "))
}

// Cut deletes slot's flows that eff does not allow (a live update), with
// no live domain-set addresses: see Keep and CutResolved.
func (c *Conntrack) Cut(ctx context.Context, slot netpolicy.Slot, eff netpolicy.Effective) (int, error) {
	return c.CutResolved(ctx, slot, eff, nil)
}

// CutResolved deletes slot's flows that Keep(flow, eff, resolved) refuses
// and says how many it deleted. A flow that ended meanwhile is not an
// error and not counted.
func (c *Conntrack) CutResolved(ctx context.Context, slot netpolicy.Slot, eff netpolicy.Effective, resolved [][]netip.Addr) (int, error) {
	conn, fs, what, err := c.dump(ctx, slot)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	n := 0
	var errs []error
	for _, f := range fs {
		t := tupleOf(f)
		if Keep(t, eff, resolved) {
			continue
		}
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		if err := conn.Delete(f); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			errs = append(errs, fmt.Errorf("delete conntrack flow %s: %w", t, err))
			continue
		}
		n++
	}
	c.logger().Debug("cut conntrack flows", "slot", slot, "filter", what, "flows", len(fs), "cut", n)
	return n, errors.Join(errs...)
}

func tupleOf(f conntrack.Flow) Tuple {
	o := f.TupleOrig
	return Tuple{
		Proto: o.Proto.Protocol,
		Src:   o.IP.SourceAddress, Dst: o.IP.DestinationAddress,
		SrcPort: o.Proto.SourcePort, DstPort: o.Proto.DestinationPort,
	}
}
