package writer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/ctld/ctld/internal/nbdsrv"
)

// Stats is what a running writer counted since it started: the NBD
// errors its server answered or ended connections over, and the times
// the kernel dropped its connection and the writer handed it a fresh one.
// PID and Epoch name the writer, so a reader tells a restarted writer
// (counting from zero again) from the same one.
type Stats struct {
	PID        int           `json:"pid"`
	Epoch      uint64        `json:"epoch"`
	NBDErrors  nbdsrv.Errors `json:"nbd_errors"`
	Reconnects uint64        `json:"reconnects"`
}

func (c *control) statsAnswer() ctlAnswer {
	if c.stats == nil {
		return ctlAnswer{Error: "this writer keeps no stats", Code: codeInvalid}
	}
	st := c.stats()
	return ctlAnswer{Stats: &st}
}

// statsTimeout bounds one writer's answer to a stats request: it is
// served beside the device, never behind its I/O.
const statsTimeout = 2 * time.Second

// Stats asks the Dir's running writer for its Stats. No writer (no
// control socket, or none listening) is ErrNotRunning.
func (s *Supervisor) Stats(ctx context.Context, dir string) (Stats, error) {
	fail := func(err error) (Stats, error) { return Stats{}, fmt.Errorf("writer stats of %s: %w", dir, err) }
	if err := s.inRoot(dir); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(ctx, statsTimeout)
	defer cancel()
	conn, err := dialControl(ctx, dir)
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	defer context.AfterFunc(ctx, func() { _ = conn.Close() })()
	b, err := json.Marshal(ctlRequest{Op: "stats"})
	if err != nil {
		return fail(err)
	}
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return fail(fmt.Errorf("send request: %w", errors.Join(ctx.Err(), err)))
	}
	ans, err := readLimited(conn, maxCtlAnswer)
	if err != nil {
		return fail(fmt.Errorf("read answer: %w", errors.Join(ctx.Err(), err)))
	}
	var a ctlAnswer
	if err := decodeStrict(ans, &a); err != nil {
		return fail(fmt.Errorf("answer: %w", err))
	}
	if a.Stats == nil {
		return fail(fmt.Errorf("answer: code %q, error %q", a.Code, a.Error))
	}
	return *a.Stats, nil
}

// DirStats is one writer dir's Stats, or why they could not be read.
type DirStats struct {
	Dir   string
	Stats Stats
	Err   error
}

// statsAtOnce bounds the writers asked at the same time.
const statsAtOnce = 8

// VolumesDir is the dir under Root that holds the persistent volumes'
// writer dirs, one level per generation: vol/<generation>/<volume>.
const VolumesDir = "vol"

// AllStats asks every running writer under Root for its Stats: the
// roots' (List's dirs) and the persistent volumes' (VolumesDir); a dir
// whose writer is gone is left out. A writer that does not answer is
// returned with its error.
func (s *Supervisor) AllStats(ctx context.Context) ([]DirStats, error) {
	dirs, err := s.List(ctx)
	if err != nil {
		return nil, err
	}
	vols, err := filepath.Glob(filepath.Join(s.Root, VolumesDir, "*", "*", StateName))
	if err != nil {
		return nil, fmt.Errorf("list volume writers: %w", err)
	}
	for _, st := range vols {
		dirs = append(dirs, filepath.Dir(st))
	}
	out := make([]DirStats, len(dirs))
	sem := make(chan struct{}, statsAtOnce)
	var wg sync.WaitGroup
	for i, dir := range dirs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			st, err := s.Stats(ctx, dir)
			out[i] = DirStats{Dir: dir, Stats: st, Err: err}
		}()
	}
	wg.Wait()
	kept := out[:0]
	for _, d := range out {
		if !errors.Is(d.Err, ErrNotRunning) {
			kept = append(kept, d)
		}
	}
	return kept, nil
}

// dialControl connects to the control socket of dir's writer; none
// there (no socket, nobody listening) is ErrNotRunning.
func dialControl(ctx context.Context, dir string) (net.Conn, error) {
	addr, done, err := ctlAddr(dir)
	if err != nil {
		return nil, err
	}
	defer done()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", addr)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w: %v", ErrNotRunning, err)
		}
		return nil, err
	}
	return conn, nil
}
