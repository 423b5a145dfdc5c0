package nbdsrv_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/nbdsrv"
)

// memBackend is an in-memory Backend for the fuzz test.
type memBackend struct {
	mu sync.Mutex
	b  []byte
}

func (m *memBackend) ReadAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return copy(p, m.b[off:]), nil
}

func (m *memBackend) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return copy(m.b[off:], p), nil
}

func (m *memBackend) Size() (int64, error) { return int64(len(m.b)), nil }
func (m *memBackend) Sync() error          { return nil }
func (m *memBackend) Trim(off, n int64) error {
	return m.WriteZeroes(off, n, false)
}

func (m *memBackend) WriteZeroes(off, n int64, _ bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.b[off : off+n])
	return nil
}

// FuzzServeConn feeds arbitrary client bytes to a connection: the server
// must neither panic, index out of range nor hang once the client is gone.
// The seeds (run by go test) are a valid session and near misses.
func FuzzServeConn(f *testing.F) {
	hello := binary.BigEndian.AppendUint32(nil, 3)
	goOpt := binary.BigEndian.AppendUint64(nil, 0x49484156454F5054)
	goOpt = binary.BigEndian.AppendUint32(goOpt, 7)
	goOpt = binary.BigEndian.AppendUint32(goOpt, 6)
	goOpt = append(goOpt, 0, 0, 0, 0, 0, 0)
	session := append(append([]byte{}, hello...), goOpt...)
	for _, r := range [][]byte{
		reqBytes(0, cmdRead, 1, 0, 512),
		append(reqBytes(1, cmdWrite, 2, 512, 4), "abcd"...),
		reqBytes(0, cmdTrim, 3, 0, 4096),
		reqBytes(2, cmdZeroes, 4, 4096, 4096),
		reqBytes(0, cmdFlush, 5, 0, 0),
		reqBytes(0, cmdRead, 6, ^uint64(0)-1, 4),
		reqBytes(0, cmdWrite, 7, 0, ^uint32(0)),
		reqBytes(0, cmdDisc, 8, 0, 0),
	} {
		session = append(session, r...)
	}
	f.Add(session)
	f.Add(append(append([]byte{}, hello...), goOpt[:20]...))
	f.Add(append(append([]byte{}, hello...), 0x49, 0x48, 0x41, 0x56, 0x45, 0x4f, 0x50, 0x54, 0, 0, 0, 6, 0, 0, 0, 9, 0, 0, 0, 200, 1, 2, 3, 4, 5))
	f.Add([]byte{0, 0, 0, 1})

	f.Fuzz(func(t *testing.T, data []byte) {
		srv, err := nbdsrv.New(nbdsrv.Export{Name: "x", Backend: &memBackend{b: make([]byte, 64<<10)}},
			nbdsrv.Options{MaxRequest: 64 << 10, HandshakeTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		cli, sc := net.Pipe()
		done := make(chan error, 1)
		go func() { done <- srv.ServeConn(context.Background(), sc) }()
		go func() { _, _ = io.Copy(io.Discard, cli) }()
		_, _ = cli.Write(data)
		_ = cli.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("ServeConn did not return after the client closed")
		}
	})
}
