package journal

import "fmt"

// PutRawUsageMark stores b as generation gen of sandbox id's usage mark,
// as it is. It is for tests of a mark this ctld cannot read (one a newer
// ctld wrote, or a damaged one): the final record of that generation
// cannot be journaled until the mark is readable.
func (t *Tx) PutRawUsageMark(id string, gen uint64, b []byte) error {
	bk, err := t.tx.CreateBucketIfNotExists(bucketUsageMarks)
	if err != nil {
		return fmt.Errorf("put usage mark: %w", err)
	}
	return bk.Put([]byte(usageMarkKey(id, gen)), b)
}
