package nbdsrv_test

import (
	"bytes"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/nbdsrv"
	"golang.org/x/sys/unix"
)

func TestKernelAttachReconfigureAfterServerDeath(t *testing.T) {
	ktest.RequireNBD(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	srv, img := newFileServer(t, 16<<20)
	devs := openDevices(t)
	idx, old := attach(t, devs, srv, nbdsrv.DeviceConfig{Index: nbdsrv.AnyIndex, Timeout: 3 * time.Second, DeadConnTimeout: 20 * time.Second})
	dev := "/dev/nbd" + strconv.Itoa(idx)
	w := startWriter(t, dev)
	w.waitWrites(t, 50, "before the server died")

	old.kill() // the primary dies: its socket closes
	killedAt := w.n.Load()
	// 6.1 marks a socket dead on a failed send or a request timeout, not
	// on the receive error, and RECONFIGURE while none is dead silently
	// does nothing (ENOSPC is answered as success). So the new primary
	// retries until the kernel holds the fresh socket: when it did not
	// take it, the server end sees EOF as soon as our copy closes.
	tries := 0
	for deadline := time.Now().Add(15 * time.Second); ; {
		tries++
		p := servePair(t, srv)
		if _, err := nbdsrv.Negotiate(p.client, "test", 5*time.Second); err != nil {
			t.Fatal(err)
		}
		err := devs.Reconfigure(idx, p.client)
		_ = p.client.Close()
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.ended: // not taken: the old socket is not dead yet
		case <-time.After(300 * time.Millisecond):
			goto taken
		}
		if time.Now().After(deadline) {
			t.Fatalf("kernel took no fresh socket in %d reconfigures", tries)
		}
		time.Sleep(200 * time.Millisecond)
	}
taken:
	stalled := w.n.Load()
	t.Logf("fresh socket taken after %d reconfigure(s)", tries)
	w.waitWrites(t, 200, "after reconfigure")
	w.stop.Store(true)
	<-w.done
	if e, _ := w.err.Load().(error); e != nil {
		t.Fatalf("writer saw %v", e)
	}
	n := w.n.Load()
	t.Logf("writes: %d before the kill, %d when the fresh socket was taken, %d at the end; no error", killedAt, stalled, n)
	if st, err := devs.Status(idx); err != nil || !st.Connected {
		t.Fatalf("status after reconfigure %+v, %v", st, err)
	}
	// Every slot holds its last write: nothing acknowledged was lost.
	fd, err := unix.Open(dev, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fsync(fd); err != nil {
		t.Fatalf("fsync: %v", err)
	}
	_ = unix.Close(fd)
	b, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	for s := int64(0); s < wSlots; s++ {
		last := n - 1 - ((n-1-s)%wSlots+wSlots)%wSlots
		blk := b[s*wBlock : (s+1)*wBlock]
		if want := bytes.Repeat([]byte{byte(last)}, wBlock); !bytes.Equal(blk, want) {
			t.Fatalf("slot %d: backing file does not hold write %d", s, last)
		}
	}
	release(t, devs, idx)
}
