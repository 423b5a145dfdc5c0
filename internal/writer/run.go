package writer

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/basecache"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/storecfg"
	"github.com/ctld/ctld/internal/cowdev"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/nbdsrv"
)

var (
	// ErrBusy: another writer holds the Dir's lock (a second writer for
	// the same sandbox is refused; the first is untouched).
	ErrBusy = errors.New("another writer runs for this dir")
	// ErrStaleEpoch: the Dir's state names this epoch or a later one, so
	// this spec is not the newest attach.
	ErrStaleEpoch = errors.New("writer epoch is not newer than the dir's")
	// ErrNotRunning: no live writer holds the Dir with the current epoch.
	ErrNotRunning = errors.New("writer not running")
	// ErrNoReattach: a Reattach spec found no device of a dead writer to
	// re-attach, or the kernel took no fresh socket for it; nothing was
	// changed.
	ErrNoReattach = errors.New("the dead writer's device cannot be re-attached")
)

// Exit codes of `ctld writer`, so the supervisor can tell refusals apart.
const (
	ExitBusy       = 3
	ExitStale      = 4
	ExitNoReattach = 5
)

// ExitCode maps Run's error to the process's exit code.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrBusy):
		return ExitBusy
	case errors.Is(err, ErrStaleEpoch):
		return ExitStale
	case errors.Is(err, ErrNoReattach):
		return ExitNoReattach
	}
	return 1
}

const (
	sysBlock         = "/sys/block"
	negotiateTimeout = 10 * time.Second
	// quiesceTimeout bounds the wait for a disconnected device's config
	// to be freed.
	quiesceTimeout = 30 * time.Second
)

// RunFile reads the spec file and runs the writer (`ctld writer --spec`).
func RunFile(ctx context.Context, specFile string, log *slog.Logger) error {
	spec, err := readSpec(specFile)
	if err != nil {
		return err
	}
	return Run(ctx, spec, log)
}

// Run is the writer process's body: it serves the device until ctx ends
// (SIGTERM), then syncs, disconnects, waits until the device is quiescent
// and removes its state file.
func Run(ctx context.Context, spec Spec, log *slog.Logger) (err error) {
	log = logging.OrDiscard(log).With("sandbox", spec.Sandbox, "generation", spec.Generation, "epoch", spec.Epoch)
	if err := spec.Check(); err != nil {
		return err
	}
	if err := os.MkdirAll(spec.Dir, 0o700); err != nil {
		return fmt.Errorf("writer dir: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(spec.Dir, LockName), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("writer lock: %w", err)
	}
	// Held until the process exits: closing the fd would drop it.
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder, _ := lockHolder(filepath.Join(spec.Dir, LockName))
			return fmt.Errorf("%w: %s (lock held by pid %d)", ErrBusy, spec.Dir, holder)
		}
		return fmt.Errorf("writer lock %s: %w", spec.Dir, err)
	}

	old, err := previousState(spec)
	if err != nil {
		return err
	}
	devs, err := nbdsrv.OpenDevices()
	if err != nil {
		return err
	}
	defer devs.Close()

	nk, err := LoadNodeKey(spec.NodeKeyFile, spec.NodeKeyID)
	if err != nil {
		return err
	}
	repo, local, err := OpenRepo(ctx, spec, nk, os.Getenv)
	if err != nil {
		return err
	}
	// The device's fetches live as long as the process: not cut by the
	// SIGTERM ctx, so the final in-flight reads still complete.
	devCtx, devCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer devCancel()
	var shared *basecache.Cache
	if spec.BaseCache != "" {
		// A cache that cannot be opened costs speed, not the device.
		if shared, err = basecache.Open(spec.BaseCache, basecache.Options{Logger: log}); err != nil {
			log.Warn("base cache not used", "err", err)
		}
	}
	dev, err := cowdev.Open(devCtx, cowdev.Config{Repo: repo, Base: spec.Base, Dir: spec.Dir, LocalStore: local, Shared: shared, Logger: log})
	if err != nil {
		return err
	}
	defer dev.Close()
	size, _ := dev.Size()
	srv, err := nbdsrv.New(nbdsrv.Export{Name: spec.Sandbox, Backend: dev}, nbdsrv.Options{Logger: log})
	if err != nil {
		return err
	}

	serveCtx, stopServe := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServe()
	var (
		idx    int
		served chan error
	)
	if spec.Reattach {
		// A restart under a mounted filesystem: the dead writer's device or
		// nothing (the primary decides what a failure means).
		if served, err = reattachOnly(ctx, serveCtx, srv, devs, old, size, spec, log); err != nil {
			return err
		}
		idx = spec.Index
	}
	if old != nil && served == nil {
		// A dead writer of this Dir may have left its device configured,
		// its I/O waiting for a reconnect: hand it a fresh socket (the
		// guest sees a pause, no error), else disconnect it.
		if ours, sameSize := staleDevice(*old, size); ours {
			if sameSize {
				served, err = reattach(ctx, serveCtx, srv, devs, old.Index, spec, log)
				if err == nil {
					idx = old.Index
				} else {
					log.Warn("re-attach failed; disconnecting the dead writer's device", "old_epoch", old.Epoch, "device", old.Device, "err", err)
				}
			}
			if served == nil {
				if err := releaseStale(ctx, spec, *old, devs, log); err != nil {
					return err
				}
			}
		}
		if served == nil {
			if err := removeDurable(filepath.Join(spec.Dir, StateName)); err != nil {
				return err
			}
		}
	}
	if served == nil {
		client, sv, err := servePair(serveCtx, srv)
		if err != nil {
			return err
		}
		info, err := nbdsrv.Negotiate(client, spec.Sandbox, negotiateTimeout)
		if err != nil {
			_ = client.Close()
			return err
		}
		idx, err = devs.Connect(nbdsrv.DeviceConfig{
			Index: spec.Index, Info: info,
			Timeout: spec.RequestTimeout, DeadConnTimeout: spec.DeadConnTimeout,
		}, client)
		_ = client.Close() // the kernel holds its own reference
		if err != nil {
			stopServe()
			<-sv
			return err
		}
		served = sv
	}
	log = log.With("device", "nbd"+strconv.Itoa(idx))
	// From here on the device is ours: every way out disconnects it.
	defer func() {
		if derr := shutdown(devs, idx, dev, stopServe, served, log); derr != nil {
			err = errors.Join(err, derr)
			return
		}
		if rerr := removeDurable(filepath.Join(spec.Dir, StateName)); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove writer state: %w", rerr))
		}
	}()

	// The control socket is up before the state file appears (the
	// supervisor's Start returns on it), and closed before the device is
	// shut down: a seal in flight is cancelled first.
	pid := os.Getpid()
	var reconnects atomic.Uint64
	stats := func() Stats {
		return Stats{PID: pid, Epoch: spec.Epoch, NBDErrors: srv.Errors(), Reconnects: reconnects.Load()}
	}
	ctl, err := listenControl(spec, dev, stats, log)
	if err != nil {
		return err
	}
	defer ctl.stop()
	if b := dev.Base(); b != spec.Base {
		// The dirty state was rebased onto a generation sealed over the
		// spec's base (cowdev's openIndex): name it in spec.json, so the
		// spec never falls further behind.
		if err := ctl.recordBase(b); err != nil {
			log.Warn("record the device's base in the spec", "base", b.String(), "err", err)
		}
	}

	_, start, err := procStat("/proc", pid)
	if err != nil {
		return fmt.Errorf("own start time: %w", err)
	}
	dpid, err := devicePID(sysBlock, idx)
	if err != nil {
		return fmt.Errorf("nbd%d pid: %w", idx, err)
	}
	state := State{PID: pid, StartTime: start, Epoch: spec.Epoch, Index: idx, Device: "/dev/nbd" + strconv.Itoa(idx), Size: size, DevicePID: dpid}
	b, err := json.Marshal(state)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(spec.Dir, StateName), b); err != nil {
		return err
	}
	log.Info("writer serving", "size", size, "request_timeout", spec.RequestTimeout, "dead_conn_timeout", spec.DeadConnTimeout)

	for {
		select {
		case <-ctx.Done():
			log.Info("writer stopping")
			return nil
		case err := <-served:
			// The kernel dropped the connection (on 6.1 a request timeout
			// marks the socket dead): its I/O waits out the dead-connection
			// timeout for a fresh socket, so give it one.
			log.Warn("nbd connection ended while serving; reconnecting", "err", err)
			reconnects.Add(1)
			sv, rerr := reattach(ctx, serveCtx, srv, devs, idx, spec, log)
			if rerr != nil {
				served = closedWith(nil)
				return fmt.Errorf("nbd connection ended while serving (%v) and no fresh one was taken: %w", err, rerr)
			}
			served = sv
		}
	}
}

// closedWith is a channel that yields err once (for shutdown's wait).
func closedWith(err error) chan error {
	c := make(chan error, 1)
	c <- err
	return c
}

// shutdown disconnects the device, lets the server finish what is in
// flight, syncs what was acknowledged and waits until the kernel freed the
// device.
func shutdown(devs *nbdsrv.Devices, idx int, dev *cowdev.Device, stopServe func(), served chan error, log *slog.Logger) error {
	var errs []error
	if err := devs.Disconnect(idx); err != nil {
		errs = append(errs, err)
	}
	// The kernel shuts its socket down on disconnect, so ServeConn
	// returns; stopServe bounds it if not.
	select {
	case <-served:
	case <-time.After(quiesceTimeout):
		stopServe()
		<-served
	}
	stopServe()
	if err := dev.Sync(); err != nil {
		errs = append(errs, fmt.Errorf("final sync: %w", err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), quiesceTimeout)
	defer cancel()
	start := time.Now()
	if _, err := nbdsrv.WaitQuiescent(ctx, devs, sysBlock, idx); err != nil {
		errs = append(errs, err)
	} else {
		log.Info("writer released the device", "quiescent_after", time.Since(start).Round(time.Millisecond))
	}
	return errors.Join(errs...)
}

// previousState returns the state file a dead writer of this Dir left
// (nil if none). A state of this epoch or a later one refuses the spec: it
// is not the newest attach.
func previousState(spec Spec) (*State, error) {
	old, err := readState(spec.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if old.Epoch >= spec.Epoch {
		return nil, fmt.Errorf("%w: %s has epoch %d, spec %d", ErrStaleEpoch, spec.Dir, old.Epoch, spec.Epoch)
	}
	return &old, nil
}

// reattachOnly serves a Reattach spec: old must name spec.Index, still
// configured by the dead writer with this device's size, and the kernel
// must take a fresh socket for it. On an error nothing was disconnected
// and the dead writer's state file is left for the next attempt or Stop.
func reattachOnly(ctx, serveCtx context.Context, srv *nbdsrv.Server, devs *nbdsrv.Devices, old *State, size int64, spec Spec, log *slog.Logger) (chan error, error) {
	if old == nil {
		return nil, fmt.Errorf("%w: %s has no dead writer's state", ErrNoReattach, spec.Dir)
	}
	if old.Index != spec.Index {
		return nil, fmt.Errorf("%w: the dead writer (epoch %d) attached %s, not nbd%d", ErrNoReattach, old.Epoch, old.Device, spec.Index)
	}
	ours, sameSize := staleDevice(*old, size)
	if !ours {
		return nil, fmt.Errorf("%w: %s is no longer the dead writer's (epoch %d, device pid %d): disconnected or taken", ErrNoReattach, old.Device, old.Epoch, old.DevicePID)
	}
	if !sameSize {
		return nil, fmt.Errorf("%w: %s does not have the size %d of the device served", ErrNoReattach, old.Device, size)
	}
	served, err := reattach(ctx, serveCtx, srv, devs, spec.Index, spec, log)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoReattach, err)
	}
	return served, nil
}

// staleDevice reports whether the device a dead writer's state names is
// still that writer's (configured, its pid file naming the writer's
// thread), and whether it has the size of the device we serve.
func staleDevice(old State, size int64) (ours, sameSize bool) {
	dpid, err := devicePID(sysBlock, old.Index)
	if err != nil || dpid == 0 || dpid != old.DevicePID {
		return false, false
	}
	b, err := os.ReadFile(filepath.Join(sysBlock, "nbd"+strconv.Itoa(old.Index), "size"))
	if err != nil {
		return true, false
	}
	sectors, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return true, err == nil && sectors*512 == size
}

// reattachTimeout bounds the attempts to hand a dead writer's device a
// fresh socket.
const reattachTimeout = 20 * time.Second

// reattach hands the device index a fresh negotiated socket in place of
// the dead writer's (NBD_CMD_RECONFIGURE). 6.1 replaces only a socket it
// marked dead, which it does on a failed send or a request timeout, and
// answers a RECONFIGURE before that as success without taking the socket.
// So a read of our own is sent (it fails on the dead socket, marking it
// dead, and then waits for the reconnect), and the reconfigure is retried
// until the kernel keeps the socket: one it did not take sees EOF as soon
// as our copy of the client end closes.
func reattach(ctx, serveCtx context.Context, srv *nbdsrv.Server, devs *nbdsrv.Devices, index int, spec Spec, log *slog.Logger) (chan error, error) {
	start := time.Now()
	dev := "/dev/nbd" + strconv.Itoa(index)
	probe := make(chan error, 1)
	go func() { probe <- probeRead(dev) }()
	for tries := 1; ; tries++ {
		client, served, err := servePair(serveCtx, srv)
		if err != nil {
			return nil, err
		}
		if _, err := nbdsrv.Negotiate(client, spec.Sandbox, negotiateTimeout); err != nil {
			_ = client.Close()
			return nil, err
		}
		err = devs.Reconfigure(index, client)
		_ = client.Close()
		if err != nil {
			return nil, err
		}
		select {
		case <-served: // not taken: the old socket is not dead yet
		case <-time.After(300 * time.Millisecond):
			// Taken: our read (and the guest's waiting I/O) goes through it.
			select {
			case err := <-probe:
				if err != nil {
					return nil, fmt.Errorf("read through the re-attached %s: %w", dev, err)
				}
			case <-time.After(spec.RequestTimeout):
				return nil, fmt.Errorf("read through the re-attached %s: no answer in %v", dev, spec.RequestTimeout)
			}
			log.Info("re-attached the dead writer's device", "device", dev, "tries", tries, "after", time.Since(start).Round(time.Millisecond))
			return served, nil
		}
		if time.Since(start) > reattachTimeout || ctx.Err() != nil {
			// The probe read ends with the dead-connection timeout;
			// releaseStale's wait for quiescence covers it.
			return nil, fmt.Errorf("the kernel took no fresh socket for %s in %d reconfigures", dev, tries)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// probeRead reads the device's first block with O_DIRECT (past the page
// cache, so it is sent to the server).
func probeRead(dev string) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return err
	}
	defer unix.Munmap(buf)
	_, err = unix.Pread(fd, buf, 0)
	return err
}

// releaseStale disconnects the device a dead writer of this Dir left
// configured, and waits until it is free. On 6.1 a disconnect of a device
// whose socket is already dead does not fail the I/O waiting for a
// reconnect: that I/O (and the config an open fd holds) ends only with the
// dead-connection timeout, so the wait covers it.
func releaseStale(ctx context.Context, spec Spec, old State, devs *nbdsrv.Devices, log *slog.Logger) error {
	log.Warn("disconnecting the device of a dead writer", "old_epoch", old.Epoch, "device", old.Device)
	if err := devs.Disconnect(old.Index); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, spec.DeadConnTimeout+quiesceTimeout)
	defer cancel()
	_, err := nbdsrv.WaitQuiescent(wctx, devs, sysBlock, old.Index)
	return err
}

// servePair makes a socketpair, serves one end until ctx ends and returns
// the other (for Negotiate and the kernel) and ServeConn's result.
func servePair(ctx context.Context, srv *nbdsrv.Server) (*net.UnixConn, chan error, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	conn := func(fd int) (*net.UnixConn, error) {
		f := os.NewFile(uintptr(fd), "nbd-pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			return nil, err
		}
		return c.(*net.UnixConn), nil
	}
	sc, err := conn(fds[0])
	if err != nil {
		_ = unix.Close(fds[1])
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	cc, err := conn(fds[1])
	if err != nil {
		_ = sc.Close()
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeConn(ctx, sc) }()
	return cc, served, nil
}

// LoadNodeKey reads a node key file (64 hex digits, as `ctl-manager
// template import` writes it).
func LoadNodeKey(path, id string) (*blockstore.NodeKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("node key: %w", err)
	}
	raw, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("node key %s: not hex: %w", path, err)
	}
	return blockstore.NewNodeKey(id, raw)
}

// OpenRepo opens the spec's block store (an S3 store's credentials from
// its file, else getenv) and the repo over it; local says it is a
// directory on this host.
func OpenRepo(ctx context.Context, spec Spec, nk *blockstore.NodeKey, getenv func(string) string) (repo *blockstore.Repo, local bool, err error) {
	sc := spec.Store
	if sc.Location == "" {
		sc = storecfg.Config{Location: spec.StoreDir}
	}
	st, err := sc.Open(ctx, false, getenv)
	if err != nil {
		return nil, false, err
	}
	repo, err = blockstore.New(st, nk, blockstore.Options{Compression: blockstore.CompressS2})
	return repo, !sc.IsS3(), err
}
