package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeRunsc writes a runsc that answers --version and flags like a build
// whose platforms are given by its flag help line.
func fakeRunsc(t *testing.T, version, platformHelp string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\ncase \"$1\" in\n" +
		"--version) printf 'runsc version " + version + "\\nspec: 1.1.0\\n' ;;\n" +
		"flags) printf '  -platform string\\n    \t" + platformHelp + "\\n' ;;\n" +
		"*) exit 1 ;;\nesac\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// doctor reports the runsc build and the platform ctld will use, from the
// command line or the configuration file, and fails a platform the build
// does not offer.
func TestDoctorReportsRunscBuildAndPlatform(t *testing.T) {
	debian := fakeRunsc(t, "0.0~20221219.0", `specifies which platform to use: ptrace (default), kvm. (default "ptrace")`)
	current := fakeRunsc(t, "release-20260831.0", `specifies which platform to use: systrap (default), ptrace, kvm. (default "systrap")`)
	state := t.TempDir()
	for _, tc := range []struct {
		name   string
		args   []string
		config string
		want   []string
	}{
		{"debian default", []string{"--runsc", debian}, "", []string{
			"ok   runsc                  " + debian + ": version 0.0~20221219.0",
			"ok   runsc platform         ptrace (the build's default; it offers ptrace, kvm)"}},
		{"current default", []string{"--runsc", current}, "", []string{
			"ok   runsc                  " + current + ": version release-20260831.0",
			"ok   runsc platform         systrap (the build's default; it offers systrap, ptrace, kvm)"}},
		{"current from config", nil, "runsc = \"" + current + "\"\nrunsc-platform = \"ptrace\"\n", []string{
			"ok   runsc platform         ptrace (set; the build offers systrap, ptrace, kvm)"}},
		{"debian cannot systrap", []string{"--runsc", debian, "--runsc-platform", "systrap"}, "", []string{
			"FAIL runsc platform         systrap (set; the build offers ptrace, kvm)",
			"     fix: set runsc-platform to one the build offers"}},
		{"no binary", []string{"--runsc", filepath.Join(state, "none")}, "", []string{"FAIL runsc                  "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"--state-dir", state}
			if tc.config != "" {
				args = append(args, "--config", writeConfig(t, t.TempDir(), tc.config))
			}
			r := ctld(t, append(append(args, "doctor"), tc.args...)...)
			for _, w := range tc.want {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("doctor output lacks %q:\n%s", w, r.stdout)
				}
			}
		})
	}
}
