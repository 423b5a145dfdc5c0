package dnsproxy

import (
	"testing"
	"time"
)

// TestRefusalsLoggedOnceAMinute: a sandbox kept at its rate by a flood
// (a token now and then) logs its refusals once a minute, with the count
// since the last log, not once a token.
func TestRefusalsLoggedOnceAMinute(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	u := newUsage(1, t0)
	var logs []int
	for i := range 600 { // 60 s of 10 queries a second at 1/s
		now := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		if ok, log, n := u.take(now, 1, 1); !ok && log {
			logs = append(logs, n)
		}
	}
	if len(logs) != 1 || logs[0] != 1 {
		t.Errorf("logged %v in the first minute, want one log of the first refusal", logs)
	}
	ok, log, n := u.take(t0.Add(61*time.Second), 1, 1)
	ok2, log2, n2 := u.take(t0.Add(61*time.Second), 1, 1)
	if !ok || ok2 || !log2 || n2 < 500 || log || n != 0 {
		t.Errorf("after a minute: %v %v %d, then %v %v %d; want a token, then a log of the ~540 refusals since", ok, log, n, ok2, log2, n2)
	}
}
