package node

import (
	"testing"
	"time"

	"github.com/ctld/ctld/internal/journal"
)

// Retries back off by doubling from the base up to the cap, so one
// unprovable generation costs a bounded number of teardowns.
func TestRetryDelay(t *testing.T) {
	base, most := time.Minute, time.Hour
	want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 16 * time.Minute, 32 * time.Minute, time.Hour, time.Hour}
	for i, w := range want {
		if got := retryDelay(base, most, i+1); got != w {
			t.Errorf("retryDelay(attempt %d) = %v, want %v", i+1, got, w)
		}
	}
	if got := retryDelay(base, most, 1000); got != time.Hour {
		t.Errorf("retryDelay(attempt 1000) = %v, want the cap", got)
	}
}

// A takeover retries the generations that were withheld when it began,
// not one its own reconcile just withheld.
func TestWithheldIn(t *testing.T) {
	ss := []journal.Sandbox{
		{ContainerID: "a-g1", Withheld: true},
		{ContainerID: "b-g1"},
	}
	pick := withheldIn(ss)
	if !pick(journal.Sandbox{ContainerID: "a-g1", Withheld: true}) {
		t.Error("a generation withheld before the takeover is not retried")
	}
	if pick(journal.Sandbox{ContainerID: "b-g1", Withheld: true}) {
		t.Error("a generation withheld by this reconcile is retried again at once")
	}
}
