package nbdsrv

import (
	"encoding/binary"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// Wire constants of the NBD protocol (doc/proto.md of NetworkBlockDevice/nbd)
// that go-nbd's protocol package does not define. Its own constants are used
// where it has them.
const (
	// Handshake flags (server) and client flags.
	flagFixedNewstyle = protocol.NEGOTIATION_HANDSHAKE_FLAG_FIXED_NEWSTYLE
	flagNoZeroes      = uint16(1 << 1)
	clientFixed       = uint32(1 << 0)
	clientNoZeroes    = uint32(1 << 1)

	// Options.
	optExportName      = uint32(1)
	optAbort           = protocol.NEGOTIATION_ID_OPTION_ABORT
	optList            = protocol.NEGOTIATION_ID_OPTION_LIST
	optInfo            = protocol.NEGOTIATION_ID_OPTION_INFO
	optGo              = protocol.NEGOTIATION_ID_OPTION_GO
	optStructuredReply = uint32(8)
	optListMetaContext = uint32(9)
	optSetMetaContext  = uint32(10)

	// Option reply types.
	repAck       = protocol.NEGOTIATION_TYPE_REPLY_ACK
	repServer    = protocol.NEGOTIATION_TYPE_REPLY_SERVER
	repInfo      = protocol.NEGOTIATION_TYPE_REPLY_INFO
	repMetaCtx   = uint32(4)
	repErrUnsup  = protocol.NEGOTIATION_TYPE_REPLY_ERR_UNSUPPORTED
	repErrInval  = uint32(3 | 1<<31)
	repErrUnknwn = protocol.NEGOTIATION_TYPE_REPLY_ERR_UNKNOWN

	// Info types.
	infoExport      = protocol.NEGOTIATION_TYPE_INFO_EXPORT
	infoName        = protocol.NEGOTIATION_TYPE_INFO_NAME
	infoDescription = protocol.NEGOTIATION_TYPE_INFO_DESCRIPTION
	infoBlockSize   = protocol.NEGOTIATION_TYPE_INFO_BLOCKSIZE

	// Transmission flags (export flags).
	tfHasFlags     = protocol.NEGOTIATION_REPLY_FLAGS_HAS_FLAGS
	tfReadOnly     = uint16(1 << 1)
	tfSendFlush    = uint16(1 << 2)
	tfSendFUA      = uint16(1 << 3)
	tfSendTrim     = uint16(1 << 5)
	tfSendZeroes   = uint16(1 << 6)
	tfCanMultiConn = protocol.NEGOTIATION_REPLY_FLAGS_CAN_MULTI_CONN

	// Commands.
	cmdRead        = protocol.TRANSMISSION_TYPE_REQUEST_READ
	cmdWrite       = protocol.TRANSMISSION_TYPE_REQUEST_WRITE
	cmdDisc        = protocol.TRANSMISSION_TYPE_REQUEST_DISC
	cmdFlush       = uint16(3)
	cmdTrim        = uint16(4)
	cmdWriteZeroes = uint16(6)
	cmdBlockStatus = uint16(7)

	// Command flags.
	cmdFlagFUA    = uint16(1 << 0)
	cmdFlagNoHole = uint16(1 << 1)
	cmdFlagReqOne = uint16(1 << 3)

	// Structured replies (NBD_OPT_STRUCTURED_REPLY): chunk header magic,
	// flags and types, and the base:allocation metadata context.
	structuredMagic     = uint32(0x668e33ef)
	replyFlagDone       = uint16(1 << 0)
	replyTypeOffsetData = uint16(1)
	replyTypeBlockStat  = uint16(5)
	replyTypeError      = uint16(1<<15 | 1)
	metaBaseAllocation  = "base:allocation"
	metaAllocID         = uint32(1) // the context's id in this server
	stateHole           = uint32(1 << 0)
	stateZero           = uint32(1 << 1)

	// Error values on the wire (fixed by the protocol, not the host's errno).
	errPerm     = protocol.TRANSMISSION_ERROR_EPERM
	errIO       = uint32(5)
	errNoMem    = uint32(12)
	errInval    = protocol.TRANSMISSION_ERROR_EINVAL
	errNoSpc    = uint32(28)
	errOverflow = uint32(75)
	errNotSup   = uint32(95)

	requestHeaderLen    = 28
	replyHeaderLen      = 16
	structuredHeaderLen = 20
)

// request is one parsed transmission request header.
type request struct {
	flags  uint16
	typ    uint16
	handle uint64
	offset uint64
	length uint32
}

// parseRequest decodes a 28-byte request header; ok is false on a bad magic,
// after which the stream cannot be trusted.
func parseRequest(b []byte) (request, bool) {
	if binary.BigEndian.Uint32(b[0:4]) != protocol.TRANSMISSION_MAGIC_REQUEST {
		return request{}, false
	}
	return request{
		flags:  binary.BigEndian.Uint16(b[4:6]),
		typ:    binary.BigEndian.Uint16(b[6:8]),
		handle: binary.BigEndian.Uint64(b[8:16]),
		offset: binary.BigEndian.Uint64(b[16:24]),
		length: binary.BigEndian.Uint32(b[24:28]),
	}, true
}

// putChunkHeader writes a 20-byte structured reply chunk header.
func putChunkHeader(b []byte, flags, typ uint16, handle uint64, length uint32) {
	binary.BigEndian.PutUint32(b[0:4], structuredMagic)
	binary.BigEndian.PutUint16(b[4:6], flags)
	binary.BigEndian.PutUint16(b[6:8], typ)
	binary.BigEndian.PutUint64(b[8:16], handle)
	binary.BigEndian.PutUint32(b[16:20], length)
}

func putReplyHeader(b []byte, errno uint32, handle uint64) {
	binary.BigEndian.PutUint32(b[0:4], protocol.TRANSMISSION_MAGIC_REPLY)
	binary.BigEndian.PutUint32(b[4:8], errno)
	binary.BigEndian.PutUint64(b[8:16], handle)
}
