// Package names holds the one rule for the IDs that become kernel object
// names (cgroups, directories, netns, nft objects, runsc container IDs) and
// how a generation's objects are named from its sandbox ID. The wire
// validation (package api) and the kernel-facing packages all use it, so a
// name the API accepts is a name every layer below accepts.
package names

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/ctld/ctld/internal/errdefs"
)

// MaxLen bounds every object name: the DNS label limit, which also fits a
// netns name, a cgroup directory and a runsc container ID.
const MaxLen = 63

// Rule is the ID rule in words, for error messages.
const Rule = "must be 1-63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit"

// The DNS label rule: nothing that could traverse a path or be read two
// ways.
var idPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Valid reports whether s is a valid ID.
func Valid(s string) bool { return idPattern.MatchString(s) }

// CheckID checks an ID (of a sandbox, lease, template, netns...) against
// the rule; kind names it in the message ("sandbox id"). The error is
// invalid_argument.
func CheckID(kind, s string) error {
	if s == "" {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "%s is empty: %s", kind, Rule)
	}
	if !Valid(s) {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "invalid %s %s: %s", kind, errdefs.Quote(s), Rule)
	}
	return nil
}

// Generation is the name of generation gen of sandbox id: its container,
// lease, netns and scratch dir are all called this.
func Generation(id string, gen uint64) string { return fmt.Sprintf("%s-g%d", id, gen) }

// CheckGeneration checks that generation gen of sandbox id has a valid
// name: a valid sandbox id, gen >= 1, and "<id>-g<gen>" within MaxLen. The
// error is invalid_argument.
func CheckGeneration(id string, gen uint64) error {
	if why := generationProblem(id, gen); why != "" {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "sandbox %s generation %d: %s", errdefs.Quote(id), gen, why)
	}
	return nil
}

func generationProblem(id string, gen uint64) string {
	if !Valid(id) {
		return "sandbox id " + Rule
	}
	if gen == 0 {
		return "generation must be >= 1"
	}
	if n := Generation(id, gen); len(n) > MaxLen {
		return fmt.Sprintf("sandbox id plus \"-g%d\" is %d characters, more than %d", gen, len(n), MaxLen)
	}
	return ""
}

// ParseGeneration is the inverse of Generation: it reports whether s is the
// name of a valid generation, "<sandbox id>-g<generation>" exactly as
// Generation writes it (no leading zeros, gen >= 1, within MaxLen), and
// which.
func ParseGeneration(s string) (id string, gen uint64, ok bool) {
	i := strings.LastIndex(s, "-g")
	if i <= 0 {
		return "", 0, false
	}
	g, err := strconv.ParseUint(s[i+2:], 10, 64)
	if err != nil || generationProblem(s[:i], g) != "" || Generation(s[:i], g) != s {
		return "", 0, false
	}
	return s[:i], g, true
}
