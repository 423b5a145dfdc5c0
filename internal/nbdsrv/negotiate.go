package nbdsrv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// ExportInfo is what a server told the client in the handshake.
type ExportInfo struct {
	Size  uint64
	Flags uint16 // transmission flags (NBD_FLAG_*), passed to the kernel as server flags
	// BlockSize is the server's preferred block size (0 when not sent).
	BlockSize uint32
}

// CanFlush and the others say what the server advertised.
func (i ExportInfo) CanFlush() bool { return i.Flags&tfSendFlush != 0 }
func (i ExportInfo) CanFUA() bool   { return i.Flags&tfSendFUA != 0 }
func (i ExportInfo) CanTrim() bool  { return i.Flags&tfSendTrim != 0 }

// ErrNegotiate marks a handshake the server refused or garbled.
var ErrNegotiate = errors.New("nbd negotiation failed")

// Negotiate runs the client side of the fixed newstyle handshake with
// NBD_OPT_GO on nc, leaving it in transmission phase: the kernel speaks
// only transmission, so the attacher negotiates before handing it the
// socket. Simple replies only (the kernel takes no structured replies).
func Negotiate(nc net.Conn, name string, timeout time.Duration) (ExportInfo, error) {
	if err := nc.SetDeadline(time.Now().Add(timeout)); err != nil {
		return ExportInfo{}, fmt.Errorf("negotiate: set deadline: %w", err)
	}
	info, err := negotiate(nc, name)
	if err != nil {
		return ExportInfo{}, fmt.Errorf("negotiate export %q: %w", name, err)
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return ExportInfo{}, fmt.Errorf("negotiate: clear deadline: %w", err)
	}
	return info, nil
}

func negotiate(rw io.ReadWriter, name string) (ExportInfo, error) {
	if len(name) > maxNameLen {
		return ExportInfo{}, fmt.Errorf("%w: name longer than %d", ErrNegotiate, maxNameLen)
	}
	var hello [18]byte
	if _, err := io.ReadFull(rw, hello[:]); err != nil {
		return ExportInfo{}, err
	}
	if binary.BigEndian.Uint64(hello[0:8]) != protocol.NEGOTIATION_MAGIC_OLDSTYLE ||
		binary.BigEndian.Uint64(hello[8:16]) != protocol.NEGOTIATION_MAGIC_OPTION {
		return ExportInfo{}, fmt.Errorf("%w: not a newstyle server", ErrNegotiate)
	}
	sf := binary.BigEndian.Uint16(hello[16:18])
	if sf&flagFixedNewstyle == 0 {
		return ExportInfo{}, fmt.Errorf("%w: server is not fixed newstyle", ErrNegotiate)
	}
	cf := clientFixed
	if sf&flagNoZeroes != 0 {
		cf |= clientNoZeroes
	}
	// Client flags, then NBD_OPT_GO asking for the block size.
	b := binary.BigEndian.AppendUint32(nil, cf)
	b = binary.BigEndian.AppendUint64(b, protocol.NEGOTIATION_MAGIC_OPTION)
	b = binary.BigEndian.AppendUint32(b, optGo)
	b = binary.BigEndian.AppendUint32(b, uint32(4+len(name)+2+2))
	b = binary.BigEndian.AppendUint32(b, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint16(b, 1)
	b = binary.BigEndian.AppendUint16(b, infoBlockSize)
	if _, err := rw.Write(b); err != nil {
		return ExportInfo{}, err
	}
	var info ExportInfo
	haveExport := false
	for {
		var h [20]byte
		if _, err := io.ReadFull(rw, h[:]); err != nil {
			return ExportInfo{}, err
		}
		if binary.BigEndian.Uint64(h[0:8]) != protocol.NEGOTIATION_MAGIC_REPLY || binary.BigEndian.Uint32(h[8:12]) != optGo {
			return ExportInfo{}, fmt.Errorf("%w: bad option reply header", ErrNegotiate)
		}
		typ := binary.BigEndian.Uint32(h[12:16])
		n := binary.BigEndian.Uint32(h[16:20])
		if n > maxOptionLen {
			return ExportInfo{}, fmt.Errorf("%w: option reply of %d bytes", ErrNegotiate, n)
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(rw, data); err != nil {
			return ExportInfo{}, err
		}
		switch {
		case typ == repAck:
			if !haveExport {
				return ExportInfo{}, fmt.Errorf("%w: GO acknowledged without export info", ErrNegotiate)
			}
			return info, nil
		case typ == repInfo:
			if len(data) < 2 {
				return ExportInfo{}, fmt.Errorf("%w: short info reply", ErrNegotiate)
			}
			switch binary.BigEndian.Uint16(data[0:2]) {
			case infoExport:
				if len(data) != 12 {
					return ExportInfo{}, fmt.Errorf("%w: export info of %d bytes", ErrNegotiate, len(data))
				}
				info.Size = binary.BigEndian.Uint64(data[2:10])
				info.Flags = binary.BigEndian.Uint16(data[10:12])
				haveExport = true
			case infoBlockSize:
				if len(data) != 14 {
					return ExportInfo{}, fmt.Errorf("%w: block size info of %d bytes", ErrNegotiate, len(data))
				}
				info.BlockSize = binary.BigEndian.Uint32(data[6:10])
			}
		case typ&(1<<31) != 0:
			return ExportInfo{}, fmt.Errorf("%w: server refused GO (reply %#x: %s)", ErrNegotiate, typ, data)
		default: // an unknown non-error reply is skipped, as the protocol asks
		}
	}
}
