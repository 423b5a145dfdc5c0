package journal

import "testing"

// TestCarrierRecords: carriers are stored by slot, listed in slot order,
// read back and deleted; a journal that never had one lists none, and a
// read-only view of it does not fail for the missing bucket.
func TestCarrierRecords(t *testing.T) {
	j := newTaken(t)
	mustView(t, j, func(tx *Tx) error {
		cs, err := tx.Carriers()
		if err != nil || len(cs) != 0 {
			t.Fatalf("fresh journal: carriers %v, %v", cs, err)
		}
		if _, ok, err := tx.Carrier(3); ok || err != nil {
			t.Fatalf("fresh journal: carrier 3 found %v, %v", ok, err)
		}
		return tx.DeleteCarrier(3) // no bucket: nothing to delete, no error
	})
	mustUpdate(t, j, func(tx *Tx) error {
		for _, s := range []uint32{17, 2} {
			if err := tx.PutCarrier(Carrier{Slot: s, Netns: "n", State: CarrierMaking, Epoch: 1}); err != nil {
				return err
			}
		}
		return nil
	})
	if err := j.Update(func(tx *Tx) error { return tx.PutCarrier(Carrier{}) }); err == nil {
		t.Fatal("a carrier without a slot was stored")
	}
	mustUpdate(t, j, func(tx *Tx) error {
		c, ok, err := tx.Carrier(17)
		if err != nil || !ok || c.State != CarrierMaking || c.RecordVersion != RecordVersion {
			t.Fatalf("carrier 17: %+v %v %v", c, ok, err)
		}
		c.State = CarrierReady
		if err := tx.PutCarrier(c); err != nil {
			return err
		}
		return tx.DeleteCarrier(2)
	})
	mustView(t, j, func(tx *Tx) error {
		cs, err := tx.Carriers()
		if err != nil || len(cs) != 1 || cs[0].Slot != 17 || cs[0].State != CarrierReady {
			t.Fatalf("carriers %+v, %v; want slot 17 ready", cs, err)
		}
		return nil
	})
}
