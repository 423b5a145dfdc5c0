package nbdsrv

import (
	"context"
	"encoding/binary"
	"errors"
	"github.com/pojntfx/go-nbd/pkg/protocol"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
)

func attrs(t *testing.T, b []byte) map[uint16][]byte {
	t.Helper()
	as, err := netlink.UnmarshalAttributes(b)
	if err != nil {
		t.Fatal(err)
	}
	m := map[uint16][]byte{}
	for _, a := range as {
		m[a.Type&^netlink.Nested] = a.Data
	}
	return m
}

func TestEncodeConnect(t *testing.T) {
	cfg := DeviceConfig{Index: 3, Info: ExportInfo{Size: 1 << 20, Flags: tfHasFlags | tfSendFlush | tfSendTrim}, Timeout: 30 * time.Second, DeadConnTimeout: 5 * time.Second}
	b, err := encodeConnect(cfg, []int{7, 9})
	if err != nil {
		t.Fatal(err)
	}
	m := attrs(t, b)
	ne := binary.NativeEndian
	if got := ne.Uint32(m[nbdAttrIndex]); got != 3 {
		t.Errorf("index %d", got)
	}
	for typ, want := range map[uint16]uint64{nbdAttrSizeBytes: 1 << 20, nbdAttrBlockSizeBytes: 4096, nbdAttrTimeout: 30, nbdAttrDeadConnTimeout: 5, nbdAttrServerFlags: uint64(tfHasFlags | tfSendFlush | tfSendTrim)} {
		if len(m[typ]) != 8 || ne.Uint64(m[typ]) != want {
			t.Errorf("attr %d = %x, want %d", typ, m[typ], want)
		}
	}
	socks, err := netlink.UnmarshalAttributes(m[nbdAttrSockets])
	if err != nil || len(socks) != 2 {
		t.Fatalf("sockets: %v %v", socks, err)
	}
	for i, want := range []uint32{7, 9} {
		item := attrs(t, socks[i].Data)
		if socks[i].Type&^netlink.Nested != nbdSockItem || ne.Uint32(item[nbdSockFD]) != want {
			t.Errorf("socket item %d: %+v", i, socks[i])
		}
	}
	// AnyIndex leaves the index out: the kernel picks a free device.
	cfg.Index = AnyIndex
	b, err = encodeConnect(cfg, []int{7})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := attrs(t, b)[nbdAttrIndex]; ok {
		t.Error("AnyIndex sent NBD_ATTR_INDEX")
	}
}

func TestEncodeConnectRefusesBadConfig(t *testing.T) {
	good := DeviceConfig{Index: 0, Info: ExportInfo{Size: 1 << 20}, Timeout: time.Second}
	for name, mut := range map[string]func(*DeviceConfig){
		"index":      func(c *DeviceConfig) { c.Index = -2 },
		"block size": func(c *DeviceConfig) { c.BlockSize = 1000 },
		"size":       func(c *DeviceConfig) { c.Info.Size = 4097 },
		"zero size":  func(c *DeviceConfig) { c.Info.Size = 0 },
		"timeout":    func(c *DeviceConfig) { c.Timeout = 1500 * time.Millisecond },
		"dead conn":  func(c *DeviceConfig) { c.DeadConnTimeout = -time.Second },
	} {
		c := good
		mut(&c)
		if _, err := encodeConnect(c, []int{3}); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: err %v, want ErrConfig", name, err)
		}
	}
	if _, err := encodeConnect(good, nil); !errors.Is(err, ErrConfig) {
		t.Errorf("no sockets: err %v", err)
	}
	if _, err := encodeReconfigure(-1, []int{3}); !errors.Is(err, ErrConfig) {
		t.Errorf("reconfigure index -1: err %v", err)
	}
}

func TestDecodeStatusAndIndex(t *testing.T) {
	ae := netlink.NewAttributeEncoder()
	ae.Nested(nbdAttrDeviceList, func(l *netlink.AttributeEncoder) error {
		for i, c := range []uint8{1, 0} {
			l.Nested(nbdDeviceItem, func(it *netlink.AttributeEncoder) error {
				it.Uint32(nbdDeviceIndex, uint32(4+i))
				it.Uint8(nbdDeviceConnected, c)
				return nil
			})
		}
		return nil
	})
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	sts, err := decodeStatus(b)
	if err != nil || len(sts) != 2 || sts[0] != (DeviceStatus{4, true}) || sts[1] != (DeviceStatus{5, false}) {
		t.Fatalf("decodeStatus = %+v, %v", sts, err)
	}
	ae = netlink.NewAttributeEncoder()
	ae.Uint32(nbdAttrIndex, 11)
	b, _ = ae.Encode()
	if i, err := decodeIndex(b); err != nil || i != 11 {
		t.Fatalf("decodeIndex = %d, %v", i, err)
	}
	if _, err := decodeIndex(nil); err == nil {
		t.Fatal("decodeIndex of an empty reply: no error")
	}
}

// Negotiate against our own server leaves the socket in transmission:
// a raw READ request is answered.
func TestNegotiateWithServer(t *testing.T) {
	img := filepath.Join(t.TempDir(), "d")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := OpenFile(img, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s, err := New(Export{Name: "x", Backend: f}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeConn(ctx, a) }()
	defer func() { cancel(); _ = b.Close(); <-done }()
	info, err := Negotiate(b, "x", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != 1<<20 || !info.CanFlush() || !info.CanFUA() || !info.CanTrim() || info.BlockSize != prefBlockSize {
		t.Fatalf("info %+v", info)
	}
	req := make([]byte, requestHeaderLen)
	binary.BigEndian.PutUint32(req[0:4], protocol.TRANSMISSION_MAGIC_REQUEST)
	binary.BigEndian.PutUint16(req[6:8], cmdRead)
	binary.BigEndian.PutUint64(req[8:16], 42)
	binary.BigEndian.PutUint32(req[24:28], 512)
	if _, err := b.Write(req); err != nil {
		t.Fatal(err)
	}
	rep := make([]byte, replyHeaderLen+512)
	if _, err := io.ReadFull(b, rep); err != nil {
		t.Fatal(err)
	}
	if errno := binary.BigEndian.Uint32(rep[4:8]); errno != 0 || binary.BigEndian.Uint64(rep[8:16]) != 42 {
		t.Fatalf("reply errno %d handle %d", errno, binary.BigEndian.Uint64(rep[8:16]))
	}
}

func TestNegotiateUnknownExport(t *testing.T) {
	img := filepath.Join(t.TempDir(), "d")
	_ = os.WriteFile(img, make([]byte, 4096), 0o600)
	f2, err := OpenFile(img, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	s, _ := New(Export{Name: "x", Backend: f2}, Options{})
	a, b := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- s.ServeConn(context.Background(), a) }()
	_, err = Negotiate(b, "nope", 5*time.Second)
	_ = b.Close()
	<-done
	if !errors.Is(err, ErrNegotiate) {
		t.Fatalf("unknown export: err %v, want ErrNegotiate", err)
	}
}
