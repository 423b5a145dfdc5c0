// Package names holds the one rule for the IDs that become kernel object
// names (cgroups, directories, netns, nft objects, runsc container IDs) and
// how a generation's objects are named from its sandbox ID. The wire
// validation (package api) and the kernel-facing packages all use it, so a
// name the API accepts is a name every layer below accepts.
package names

import (
	"fmt"
	"regexp"
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

// Generation is the name of generation gen of sandbox id: its container,
// lease, netns and scratch dir are all called this.
func Generation(id string, gen uint64) string { return fmt.Sprintf("%s-g%d", id, gen) }

// CheckGeneration reports why generation gen of sandbox id has no valid
// name, or "" if it has one.
func CheckGeneration(id string, gen uint64) string {
	if !Valid(id) {
		return "sandbox id " + Rule
	}
	if n := Generation(id, gen); len(n) > MaxLen {
		return fmt.Sprintf("sandbox id plus \"-g%d\" is %d characters, more than %d", gen, len(n), MaxLen)
	}
	return ""
}
