package nbdsrv

import "sync/atomic"

// Errors counts what a server answered with an NBD error, or ended a
// connection over, since it was built: the writer reports them to the
// primary (ctld_nbd_errors_total). Each is a kind of failure an operator
// tells apart: the backend's (store fetch, tampered chunk, dirty file
// I/O) by command, the requests refused before the backend, and the
// connections that ended with an error.
type Errors struct {
	Read        uint64 `json:"read"`
	Write       uint64 `json:"write"`
	Flush       uint64 `json:"flush"`
	Trim        uint64 `json:"trim"`
	WriteZeroes uint64 `json:"write_zeroes"`
	BlockStatus uint64 `json:"block_status"`
	// Refused: requests answered with an error before the backend saw
	// them (a range past the device, a bad flag, a write to a read-only
	// export, an unknown command).
	Refused uint64 `json:"refused"`
	// Connection: connections that ended with an error (a protocol
	// violation, a failed handshake, a reply that could not be written).
	Connection uint64 `json:"connection"`
}

// ByKind is e by the kind names of ctld_nbd_errors_total.
func (e Errors) ByKind() map[string]uint64 {
	return map[string]uint64{
		"read": e.Read, "write": e.Write, "flush": e.Flush, "trim": e.Trim,
		"write_zeroes": e.WriteZeroes, "block_status": e.BlockStatus,
		"refused": e.Refused, "connection": e.Connection,
	}
}

// errCounters are a server's live counts (Server.Errors reads them).
type errCounters struct {
	read, write, flush, trim, zeroes, status, refused, conn atomic.Uint64
}

// backend counts a backend failure of command typ.
func (c *errCounters) backend(typ uint16) {
	switch typ {
	case cmdRead:
		c.read.Add(1)
	case cmdWrite:
		c.write.Add(1)
	case cmdFlush:
		c.flush.Add(1)
	case cmdTrim:
		c.trim.Add(1)
	case cmdWriteZeroes:
		c.zeroes.Add(1)
	case cmdBlockStatus:
		c.status.Add(1)
	}
}

// Errors is what the server counted so far.
func (s *Server) Errors() Errors {
	c := &s.errs
	return Errors{
		Read: c.read.Load(), Write: c.write.Load(), Flush: c.flush.Load(), Trim: c.trim.Load(),
		WriteZeroes: c.zeroes.Load(), BlockStatus: c.status.Load(),
		Refused: c.refused.Load(), Connection: c.conn.Load(),
	}
}
