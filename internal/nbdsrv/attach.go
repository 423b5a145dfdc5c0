package nbdsrv

// Kernel device configuration through the NBD generic-netlink family
// (include/uapi/linux/nbd-netlink.h). Unlike the ioctl interface, a device
// configured this way does not die with the configuring process: the next
// primary can reconfigure it with a fresh socket (NBD_CMD_RECONFIGURE)
// within the dead-connection timeout.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
)

// Generic-netlink family "nbd", version 1.
const (
	nbdFamily  = "nbd"
	nbdVersion = 1

	nbdCmdConnect     = 1
	nbdCmdDisconnect  = 2
	nbdCmdReconfigure = 3
	nbdCmdStatus      = 5

	nbdAttrIndex           = 1 // u32
	nbdAttrSizeBytes       = 2 // u64
	nbdAttrBlockSizeBytes  = 3 // u64
	nbdAttrTimeout         = 4 // u64, seconds
	nbdAttrServerFlags     = 5 // u64
	nbdAttrClientFlags     = 6 // u64
	nbdAttrSockets         = 7 // nested NBD_SOCK_ITEM
	nbdAttrDeadConnTimeout = 8 // u64, seconds
	nbdAttrDeviceList      = 9 // nested NBD_DEVICE_ITEM

	nbdSockItem = 1
	nbdSockFD   = 1 // u32

	nbdDeviceItem      = 1
	nbdDeviceIndex     = 1 // u32
	nbdDeviceConnected = 2 // u8
)

// AnyIndex asks the kernel for any free device.
const AnyIndex = -1

// DeviceConfig is one NBD_CMD_CONNECT.
type DeviceConfig struct {
	// Index is the /dev/nbdX to configure, or AnyIndex.
	Index int
	// Info comes from Negotiate: size and the flags the server advertised
	// (FLUSH/FUA/TRIM are taken by the kernel from these).
	Info ExportInfo
	// BlockSize is the logical block size (default 4096; a power of two,
	// 512..4096).
	BlockSize uint64
	// Timeout is the per-request timeout (whole seconds, at least 1).
	Timeout time.Duration
	// DeadConnTimeout is how long I/O waits for a RECONFIGURE after every
	// connection died, instead of failing (whole seconds; 0 fails at once).
	DeadConnTimeout time.Duration
}

// ErrConfig marks a DeviceConfig refused before anything reached the kernel.
var ErrConfig = errors.New("invalid nbd device config")

func (c *DeviceConfig) check() error {
	if c.BlockSize == 0 {
		c.BlockSize = 4096
	}
	switch {
	case c.Index < AnyIndex:
		return fmt.Errorf("%w: index %d", ErrConfig, c.Index)
	case c.BlockSize < 512 || c.BlockSize > 4096 || c.BlockSize&(c.BlockSize-1) != 0:
		return fmt.Errorf("%w: block size %d", ErrConfig, c.BlockSize)
	case c.Info.Size == 0 || c.Info.Size%c.BlockSize != 0:
		return fmt.Errorf("%w: size %d is not a positive multiple of the block size %d", ErrConfig, c.Info.Size, c.BlockSize)
	case c.Timeout < time.Second || c.Timeout%time.Second != 0:
		return fmt.Errorf("%w: timeout %v is not whole seconds >= 1s", ErrConfig, c.Timeout)
	case c.DeadConnTimeout < 0 || c.DeadConnTimeout%time.Second != 0:
		return fmt.Errorf("%w: dead-connection timeout %v is not whole seconds", ErrConfig, c.DeadConnTimeout)
	}
	return nil
}

// encodeSockets adds NBD_ATTR_SOCKETS with one item per fd.
func encodeSockets(ae *netlink.AttributeEncoder, fds []int) {
	ae.Nested(nbdAttrSockets, func(nae *netlink.AttributeEncoder) error {
		for _, fd := range fds {
			nae.Nested(nbdSockItem, func(s *netlink.AttributeEncoder) error {
				s.Uint32(nbdSockFD, uint32(fd))
				return nil
			})
		}
		return nil
	})
}

// encodeConnect is the attribute payload of NBD_CMD_CONNECT.
func encodeConnect(c DeviceConfig, fds []int) ([]byte, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if len(fds) == 0 {
		return nil, fmt.Errorf("%w: no socket", ErrConfig)
	}
	ae := netlink.NewAttributeEncoder()
	if c.Index != AnyIndex {
		ae.Uint32(nbdAttrIndex, uint32(c.Index))
	}
	ae.Uint64(nbdAttrSizeBytes, c.Info.Size)
	ae.Uint64(nbdAttrBlockSizeBytes, c.BlockSize)
	ae.Uint64(nbdAttrServerFlags, uint64(c.Info.Flags))
	ae.Uint64(nbdAttrTimeout, uint64(c.Timeout/time.Second))
	ae.Uint64(nbdAttrDeadConnTimeout, uint64(c.DeadConnTimeout/time.Second))
	encodeSockets(ae, fds)
	return ae.Encode()
}

// encodeIndex is the payload of DISCONNECT and STATUS.
func encodeIndex(index int) ([]byte, error) {
	if index < 0 {
		return nil, fmt.Errorf("%w: index %d", ErrConfig, index)
	}
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(nbdAttrIndex, uint32(index))
	return ae.Encode()
}

// encodeReconfigure is the payload of NBD_CMD_RECONFIGURE with new sockets.
func encodeReconfigure(index int, fds []int) ([]byte, error) {
	if index < 0 || len(fds) == 0 {
		return nil, fmt.Errorf("%w: reconfigure index %d with %d sockets", ErrConfig, index, len(fds))
	}
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(nbdAttrIndex, uint32(index))
	encodeSockets(ae, fds)
	return ae.Encode()
}

// decodeIndex reads NBD_ATTR_INDEX from the CONNECT reply.
func decodeIndex(b []byte) (int, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return 0, err
	}
	idx := -1
	for ad.Next() {
		if ad.Type() == nbdAttrIndex {
			idx = int(ad.Uint32())
		}
	}
	if err := ad.Err(); err != nil {
		return 0, err
	}
	if idx < 0 {
		return 0, errors.New("connect reply without NBD_ATTR_INDEX")
	}
	return idx, nil
}

// DeviceStatus is one entry of NBD_CMD_STATUS.
type DeviceStatus struct {
	Index     int
	Connected bool
}

func decodeStatus(b []byte) ([]DeviceStatus, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	var out []DeviceStatus
	for ad.Next() {
		if ad.Type() != nbdAttrDeviceList {
			continue
		}
		ad.Nested(func(list *netlink.AttributeDecoder) error {
			for list.Next() {
				if list.Type() != nbdDeviceItem {
					continue
				}
				list.Nested(func(item *netlink.AttributeDecoder) error {
					st := DeviceStatus{Index: -1}
					for item.Next() {
						switch item.Type() {
						case nbdDeviceIndex:
							st.Index = int(item.Uint32())
						case nbdDeviceConnected:
							st.Connected = item.Uint8() != 0
						}
					}
					out = append(out, st)
					return nil
				})
			}
			return nil
		})
	}
	return out, ad.Err()
}

// Devices configures kernel NBD devices over one generic-netlink socket.
type Devices struct {
	c      *genetlink.Conn
	family genetlink.Family
}

// OpenDevices dials generic netlink and resolves the "nbd" family (present
// once the nbd module is loaded). The kernel registers that family in the
// initial network namespace only (it is not netnsok), so a ctld in a
// network namespace of its own (a container; the fleet's VM tests run two
// ctlds so) does not find it there: it then dials it in the initial one
// (initNetNS; root only). The devices and the sockets handed to them are
// not per namespace.
func OpenDevices() (*Devices, error) {
	d, err := openDevices(nil)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return d, err
	}
	ns, oerr := os.Open(initNetNS)
	if oerr != nil {
		return nil, errors.Join(err, fmt.Errorf("open the initial network namespace: %w", oerr))
	}
	defer ns.Close()
	d, ierr := openDevices(&netlink.Config{NetNS: int(ns.Fd())})
	if ierr != nil {
		return nil, errors.Join(err, fmt.Errorf("in the initial network namespace: %w", ierr))
	}
	return d, nil
}

// initNetNS is the initial network namespace, where the nbd family lives.
const initNetNS = "/proc/1/ns/net"

func openDevices(cfg *netlink.Config) (*Devices, error) {
	c, err := genetlink.Dial(cfg)
	if err != nil {
		return nil, fmt.Errorf("dial generic netlink: %w", err)
	}
	f, err := c.GetFamily(nbdFamily)
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("generic netlink family %q (nbd module loaded?): %w", nbdFamily, err)
	}
	return &Devices{c: c, family: f}, nil
}

// Close closes the netlink socket; configured devices stay configured.
func (d *Devices) Close() error { return d.c.Close() }

func (d *Devices) exec(cmd uint8, data []byte, flags netlink.HeaderFlags) ([]genetlink.Message, error) {
	return d.c.Execute(genetlink.Message{
		Header: genetlink.Header{Command: cmd, Version: nbdVersion},
		Data:   data,
	}, d.family.ID, flags)
}

// connFDs returns the fds of the connections; the kernel takes its own
// reference to each socket during the call, so the caller closes its copies
// afterwards (the server keeps the other ends).
func connFDs(conns []*net.UnixConn) ([]int, func(), error) {
	var files []interface{ Close() error }
	var fds []int
	closeAll := func() {
		for _, f := range files {
			_ = f.Close()
		}
	}
	for _, c := range conns {
		f, err := c.File() // a dup: blocking mode, owned by us
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("socket fd: %w", err)
		}
		files = append(files, f)
		fds = append(fds, int(f.Fd()))
	}
	return fds, closeAll, nil
}

// Connect configures a device with negotiated sockets (one per connection;
// more than one needs a server that advertised multi-conn) and returns
// its index.
func (d *Devices) Connect(cfg DeviceConfig, conns ...*net.UnixConn) (int, error) {
	fds, done, err := connFDs(conns)
	if err != nil {
		return 0, err
	}
	defer done()
	data, err := encodeConnect(cfg, fds)
	if err != nil {
		return 0, err
	}
	msgs, err := d.exec(nbdCmdConnect, data, netlink.Request)
	if err != nil {
		return 0, fmt.Errorf("nbd connect (index %d): %w", cfg.Index, err)
	}
	if len(msgs) != 1 {
		return 0, fmt.Errorf("nbd connect: %d reply messages", len(msgs))
	}
	idx, err := decodeIndex(msgs[0].Data)
	if err != nil {
		return 0, fmt.Errorf("nbd connect: %w", err)
	}
	return idx, nil
}

// Reconfigure hands a device fresh negotiated sockets in place of dead ones
// (the kernel answers ENOSPC while no connection is dead: it replaces, it
// does not add). I/O queued during the dead-connection timeout resumes.
func (d *Devices) Reconfigure(index int, conns ...*net.UnixConn) error {
	fds, done, err := connFDs(conns)
	if err != nil {
		return err
	}
	defer done()
	data, err := encodeReconfigure(index, fds)
	if err != nil {
		return err
	}
	if _, err := d.exec(nbdCmdReconfigure, data, netlink.Request|netlink.Acknowledge); err != nil {
		return fmt.Errorf("nbd reconfigure nbd%d: %w", index, err)
	}
	return nil
}

// Disconnect asks the kernel to disconnect a device. The device's config is
// freed asynchronously afterwards: WaitQuiescent waits for that.
func (d *Devices) Disconnect(index int) error {
	data, err := encodeIndex(index)
	if err != nil {
		return err
	}
	if _, err := d.exec(nbdCmdDisconnect, data, netlink.Request|netlink.Acknowledge); err != nil {
		return fmt.Errorf("nbd disconnect nbd%d: %w", index, err)
	}
	return nil
}

// Status reports whether a device has a live connection.
func (d *Devices) Status(index int) (DeviceStatus, error) {
	data, err := encodeIndex(index)
	if err != nil {
		return DeviceStatus{}, err
	}
	msgs, err := d.exec(nbdCmdStatus, data, netlink.Request)
	if err != nil {
		return DeviceStatus{}, fmt.Errorf("nbd status nbd%d: %w", index, err)
	}
	for _, m := range msgs {
		sts, err := decodeStatus(m.Data)
		if err != nil {
			return DeviceStatus{}, fmt.Errorf("nbd status nbd%d: %w", index, err)
		}
		for _, st := range sts {
			if st.Index == index {
				return st, nil
			}
		}
	}
	return DeviceStatus{}, fmt.Errorf("nbd status: nbd%d not in the reply", index)
}
