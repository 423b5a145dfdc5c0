package main

import (
	"fmt"

	"github.com/spf13/pflag"
)

// runscFlags are the runsc settings of `ctld run` (and of `ctld doctor`,
// which reports them): the binary and its platform.
func runscFlags(f *pflag.FlagSet, binary, platform *string) {
	f.StringVar(binary, "runsc", "runsc", "runsc binary (Debian's, or a current gVisor build: docs/operations.md, \"runsc\")")
	f.StringVar(platform, "runsc-platform", "", "runsc's --platform: ptrace, systrap or kvm (empty: the binary's default, ptrace on Debian's 20221219, systrap on a current build)")
}

// validPlatform accepts the platforms runsc builds offer; whether this
// binary offers it, `ctld doctor` checks.
func validPlatform(p string) error {
	switch p {
	case "", "ptrace", "systrap", "kvm":
		return nil
	}
	return fmt.Errorf("unknown platform %q (ptrace, systrap, kvm, or empty for runsc's default)", p)
}
