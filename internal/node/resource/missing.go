package resource

import (
	"context"

	"github.com/ctld/ctld/internal/journal"
)

// MissingUnless is the Missing of a survey that found the objects named in
// set: what is gone when name(rec) is not among them.
func MissingUnless(set map[string]bool, name func(journal.Sandbox) string, what string) Missing {
	return func(_ context.Context, rec journal.Sandbox) string {
		if n := name(rec); n != "" && !set[n] {
			return what
		}
		return ""
	}
}
