package nbdsrv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Quiescence is a device's release state as sysfs shows it.
type Quiescence struct {
	Connected bool
	Sectors   int64    // /sys/block/nbdX/size
	Holders   []string // /sys/block/nbdX/holders
	Inflight  string   // /sys/block/nbdX/inflight ("reads writes")
	PID       bool     // /sys/block/nbdX/pid present: a config still held
}

// Quiet is true when nothing holds the device any more: it can be reused.
func (q Quiescence) Quiet() bool {
	return !q.Connected && q.Sectors == 0 && len(q.Holders) == 0 && inflightZero(q.Inflight) && !q.PID
}

func (q Quiescence) String() string {
	return fmt.Sprintf("connected=%v size=%d sectors holders=%v inflight=%q pid-present=%v",
		q.Connected, q.Sectors, q.Holders, q.Inflight, q.PID)
}

func inflightZero(s string) bool {
	for _, f := range strings.Fields(s) {
		if f != "0" {
			return false
		}
	}
	return true
}

// ReadQuiescence reads one device's state; sysRoot is normally "/sys/block".
func ReadQuiescence(d *Devices, sysRoot string, index int) (Quiescence, error) {
	dir := filepath.Join(sysRoot, "nbd"+strconv.Itoa(index))
	var q Quiescence
	st, err := d.Status(index)
	if err != nil {
		return q, err
	}
	q.Connected = st.Connected
	b, err := os.ReadFile(filepath.Join(dir, "size"))
	if err != nil {
		return q, fmt.Errorf("read nbd%d size: %w", index, err)
	}
	if q.Sectors, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil {
		return q, fmt.Errorf("parse nbd%d size: %w", index, err)
	}
	ents, err := os.ReadDir(filepath.Join(dir, "holders"))
	if err != nil {
		return q, fmt.Errorf("read nbd%d holders: %w", index, err)
	}
	for _, e := range ents {
		q.Holders = append(q.Holders, e.Name())
	}
	b, err = os.ReadFile(filepath.Join(dir, "inflight"))
	if err != nil {
		return q, fmt.Errorf("read nbd%d inflight: %w", index, err)
	}
	q.Inflight = strings.TrimSpace(string(b))
	if _, err := os.Stat(filepath.Join(dir, "pid")); err == nil {
		q.PID = true
	} else if !errors.Is(err, os.ErrNotExist) {
		return q, fmt.Errorf("stat nbd%d pid: %w", index, err)
	}
	return q, nil
}

// ErrNotQuiescent is returned when a device stays busy past the wait.
var ErrNotQuiescent = errors.New("nbd device not quiescent")

// WaitQuiescent waits, polling, until the device is free after a
// disconnect: the kernel drops a disconnected device's config
// asynchronously, and reusing it before then answers EBUSY. It gives up
// when ctx ends, saying what was still held.
func WaitQuiescent(ctx context.Context, d *Devices, sysRoot string, index int) (Quiescence, error) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		q, err := ReadQuiescence(d, sysRoot, index)
		if err != nil {
			return q, err
		}
		if q.Quiet() {
			return q, nil
		}
		select {
		case <-ctx.Done():
			return q, fmt.Errorf("%w: waiting for nbd%d to be released (not connected, size 0, no holders, inflight 0, pid gone): still %s: %w",
				ErrNotQuiescent, index, q, ctx.Err())
		case <-t.C:
		}
	}
}
