package journal

import (
	"fmt"
	"time"
)

// bucketCarriers holds the warm network carriers (docs/network-design.md
// §8), keyed by slot. It is made by the first write, so a journal of an
// older ctld opens as it is.
var bucketCarriers = []byte("carriers")

// CarrierState is where a warm carrier is in its life. The record is the
// carrier's effect record too: written before its netns and veth are made
// (making) and before they are removed (removing).
type CarrierState string

// Carrier states.
const (
	CarrierMaking   CarrierState = "making"
	CarrierReady    CarrierState = "ready"
	CarrierRemoving CarrierState = "removing"
)

// Carrier is a warm network carrier: a netns with a veth on an address
// slot of the pool, made ahead of any claim. It holds its slot (no claim
// and no other carrier gets it) and no lease. A claim takes a ready one in
// its admitting transaction: the record is deleted there and the
// generation's record names the slot and the netns from then on.
type Carrier struct {
	RecordVersion int          `json:"record_version,omitempty"`
	Slot          uint32       `json:"slot"`
	Netns         string       `json:"netns"`
	State         CarrierState `json:"state"`
	Epoch         uint64       `json:"epoch"`
	Updated       time.Time    `json:"updated"`
	// The netns's kernel identity once made (see Sandbox.NetnsIno).
	NetnsDev    uint64 `json:"netns_dev,omitempty"`
	NetnsIno    uint64 `json:"netns_ino,omitempty"`
	NetnsCookie uint64 `json:"netns_cookie,omitempty"`
}

func carrierKey(slot uint32) string { return fmt.Sprintf("%08x", slot) }

// PutCarrier records a carrier in its current state.
func (t *Tx) PutCarrier(c Carrier) error {
	if c.Slot == 0 {
		return fmt.Errorf("carrier without a slot")
	}
	if _, err := t.tx.CreateBucketIfNotExists(bucketCarriers); err != nil {
		return err
	}
	c.RecordVersion = RecordVersion
	c.Updated = time.Now().UTC()
	return put(t.tx, bucketCarriers, carrierKey(c.Slot), c)
}

// DeleteCarrier forgets a carrier: taken by a claim, or proven gone.
func (t *Tx) DeleteCarrier(slot uint32) error {
	b := t.tx.Bucket(bucketCarriers)
	if b == nil {
		return nil
	}
	return b.Delete([]byte(carrierKey(slot)))
}

// Carrier reads one carrier record.
func (t *Tx) Carrier(slot uint32) (Carrier, bool, error) {
	var c Carrier
	if t.tx.Bucket(bucketCarriers) == nil {
		return c, false, nil
	}
	ok, err := get(t.tx, bucketCarriers, carrierKey(slot), &c)
	return c, ok, err
}

// Carriers lists the carrier records, by slot.
func (t *Tx) Carriers() ([]Carrier, error) {
	if t.tx.Bucket(bucketCarriers) == nil {
		return nil, nil
	}
	return all[Carrier](t.tx, bucketCarriers)
}
