package journal

import (
	"fmt"
	"time"
)

// bucketHeadMarks holds the node's high-water mark of each block-store
// volume's head (issue 21): the highest head this node read or
// published. The bucket of a volume's heads is not trusted to keep them:
// whoever controls it can delete the newest head object or put back an
// older one, and the older head still authenticates. A resume or an
// attach below the mark is refused. The bucket is made by the first write,
// so a journal of an older ctld opens as it is; the marks live in the
// journal the standby takes over, so they survive failover.
var bucketHeadMarks = []byte("headmarks")

// HeadMark is the highest head of one volume this node has seen.
type HeadMark struct {
	RecordVersion int       `json:"record_version,omitempty"`
	Volume        string    `json:"volume"` // the store's name: sandboxes/ID, volumes/ID
	Seq           uint64    `json:"seq"`
	Generation    uint64    `json:"generation"`
	Updated       time.Time `json:"updated"`
}

// HeadMark reads volume's mark (Seq 0: none).
func (t *Tx) HeadMark(volume string) (HeadMark, error) {
	var m HeadMark
	if t.tx.Bucket(bucketHeadMarks) == nil {
		return m, nil
	}
	_, err := get(t.tx, bucketHeadMarks, volume, &m)
	return m, err
}

// RaiseHeadMark moves volume's mark up to (seq, generation); a mark at
// or above seq stays (the mark never moves down). It returns the mark.
func (t *Tx) RaiseHeadMark(volume string, seq, generation uint64) (HeadMark, error) {
	if volume == "" {
		return HeadMark{}, fmt.Errorf("head mark without a volume")
	}
	cur, err := t.HeadMark(volume)
	if err != nil || seq <= cur.Seq {
		return cur, err
	}
	if _, err := t.tx.CreateBucketIfNotExists(bucketHeadMarks); err != nil {
		return cur, err
	}
	m := HeadMark{RecordVersion: RecordVersion, Volume: volume, Seq: seq, Generation: generation, Updated: time.Now().UTC()}
	return m, put(t.tx, bucketHeadMarks, volume, m)
}
