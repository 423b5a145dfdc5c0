package journal

import (
	"fmt"
	"time"
)

// bucketWarm holds the warm pool's members (docs/architecture.md "Warm
// pool"), keyed by member id. It is made by the first write, so a journal
// of an older ctld opens as it is. A member is never in the sandboxes
// bucket: it is no user's sandbox, the API never lists it, and its id
// (and container id) never clashes with a generation's, whose names all
// end in "-g<generation>".
var bucketWarm = []byte("warm")

// WarmState is where a warm member is in its life.
type WarmState string

// Warm member states.
const (
	WarmBooting  WarmState = "booting"  // being made; its effect records say how far
	WarmIdle     WarmState = "idle"     // booted, its agent answered the member nonce
	WarmRemoving WarmState = "removing" // being destroyed (cleanup proof)
)

// WarmMember is a warm pool member: a whole guest booted ahead of any
// claim. Rec is its generation record as a claim's would be (Warm set,
// generation 0, which no sandbox's generation is): the claim table's walk
// makes it and the ordinary teardown removes it; its effect records are
// keyed by its container id. A claim that takes it deletes this record
// and re-keys its effect records to the claim's sandbox and generation in
// its admitting transaction.
type WarmMember struct {
	RecordVersion int       `json:"record_version,omitempty"`
	State         WarmState `json:"state"`
	// Runsc is the runsc build the member was booted with.
	Runsc string `json:"runsc"`
	// Since is when the member entered State.
	Since   time.Time `json:"since"`
	Updated time.Time `json:"updated"`
	Rec     Sandbox   `json:"rec"`
}

// PutWarmMember records a member in its current state.
func (t *Tx) PutWarmMember(m WarmMember) error {
	if m.Rec.ID == "" || !m.Rec.Warm {
		return fmt.Errorf("warm member record without an id or not marked warm")
	}
	if _, err := t.tx.CreateBucketIfNotExists(bucketWarm); err != nil {
		return err
	}
	m.RecordVersion = RecordVersion
	m.Updated = time.Now().UTC()
	return put(t.tx, bucketWarm, m.Rec.ID, m)
}

// DeleteWarmMember forgets a member: taken by a claim, or proven gone.
func (t *Tx) DeleteWarmMember(id string) error {
	b := t.tx.Bucket(bucketWarm)
	if b == nil {
		return nil
	}
	return b.Delete([]byte(id))
}

// WarmMember reads one member record.
func (t *Tx) WarmMember(id string) (WarmMember, bool, error) {
	var m WarmMember
	if t.tx.Bucket(bucketWarm) == nil {
		return m, false, nil
	}
	ok, err := get(t.tx, bucketWarm, id, &m)
	return m, ok, err
}

// WarmMembers lists the member records, by id.
func (t *Tx) WarmMembers() ([]WarmMember, error) {
	if t.tx.Bucket(bucketWarm) == nil {
		return nil, nil
	}
	return all[WarmMember](t.tx, bucketWarm)
}

// Holders is every record that may hold capacity, a disk project or an
// address slot: the live sandbox generations and the warm members' (their
// records hold while booting, idle or being removed, or are withheld).
// Allocations (disk project, address slot) read it so a member's never
// goes to a claim or a carrier.
func (t *Tx) Holders() ([]Sandbox, error) {
	ss, err := t.LiveSandboxes()
	if err != nil {
		return nil, err
	}
	ms, err := t.WarmMembers()
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		ss = append(ss, m.Rec)
	}
	return ss, nil
}
