// Package model checks the fleet's placement and lost-node takeover
// protocol (issue 24) with spin: fleet.pml models the store's
// transactions, the node processes and their ctlds as the code implements
// them; the check is exhaustive (no bitstate) and takes seconds. Variants
// with a check of the code removed must fail, so the model is shown to
// catch what it claims to.
package model

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// variant is one model run: the -D flags and what it must find.
type variant struct {
	name    string
	defines []string
	// fails: the run must end in an assertion violation matching want
	// (pan prints the failed assertion's expanded text).
	fails bool
	want  *regexp.Regexp
}

// staleWriter is the failure of a stale writer's publish: accepted for a
// generation that is not the sandbox's newest (the publish's assertion),
// or two running writers of one root whose publish would be accepted (the
// never claim's ONE_WRITER, which names published[]).
var staleWriter = regexp.MustCompile(`assertion violated \(g==sgen\[s\]\)|assertion violated .*!\(published\[`)

// orphan is the quiescent check's failure: a generation runs on a ctld
// that the database does not give it (as ready) when nothing moves any more.
var orphan = regexp.MustCompile(`assertion violated \( !\(phys\[`)

var variants = []variant{
	// The code as it is: every invariant holds in every reachable state.
	{name: "code", fails: false},
	// Both nodes lost (and back) in one run; and a node holding two.
	{name: "two losses", defines: []string{"MAXLOSS=2"}, fails: false},
	{name: "node 0 holds two", defines: []string{"CAP0=2"}, fails: false},
	// Either fence alone refuses a stale writer: holdsTx (the node must
	// hold the sandbox's current generation) and the head's writer epoch
	// CAS (raised by the takeover).
	{name: "epoch CAS alone", defines: []string{"BUG_NO_HOLDS"}, fails: false},
	{name: "holdsTx alone", defines: []string{"BUG_NO_EPOCH"}, fails: false},
	// Without both, the lost node's writer publishes over the new one.
	{name: "no fence", defines: []string{"BUG_NO_FENCE"}, fails: true, want: staleWriter},
	// The takeover before this session raised only an existing head row:
	// with holdsTx gone a never-published sandbox's old writer got through.
	{name: "takeover without a head row", defines: []string{"BUG_NO_HOLDS", "BUG_TAKEOVER_NO_ROW"}, fails: true, want: staleWriter},
	// The node process's reconcile as it was (no readopt; releaseAbandoned
	// at registration only): a block sandbox whose node came back before
	// any takeover stays lost for good while it runs.
	{name: "reconcile at registration only", defines: []string{"BUG_REGISTRATION_ONLY"}, fails: true, want: orphan},
	// Placement that trusts its plain read of the nodes (no check of the
	// locked row) overcommits a node.
	{name: "placement without the locked recheck", defines: []string{"BUG_NO_RECHECK"}, fails: true, want: regexp.MustCompile(`assertion violated \(reserved\[n\]<=cap\[n\]\)`)},
}

func TestFleetModel(t *testing.T) {
	spin, err := exec.LookPath("spin")
	if err != nil {
		t.Fatalf("spin is missing (test/model/setup.sh installs it): %v", err)
	}
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Fatalf("gcc is missing (test/model/setup.sh installs it): %v", err)
	}
	src, err := os.ReadFile("fleet.pml")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			res := check(t, spin, cc, src, v.defines, v.fails)
			t.Logf("%s: %d states, %d errors, %s", v.name, res.states, res.errors, res.elapsed)
			switch {
			case !v.fails && res.errors != 0:
				t.Fatalf("the model fails:\n%s\ntrail:\n%s", res.out, res.trail)
			case !v.fails && !res.complete:
				t.Fatalf("the search did not complete (raise the memory or depth bound):\n%s", res.out)
			case v.fails && res.errors == 0:
				t.Fatalf("the variant %v passed; the model must catch it:\n%s", v.defines, res.out)
			case v.fails && !v.want.Match(res.out):
				t.Fatalf("the variant %v failed, but not on %q:\n%s", v.defines, v.want, res.out)
			}
			if v.fails {
				t.Logf("counterexample (spin -t):\n%s", res.trail)
			}
		})
	}
}

type result struct {
	out      []byte // pan's report
	trail    []byte // the counterexample's steps, if any
	states   int
	errors   int
	complete bool
	elapsed  time.Duration
}

var (
	errorsRE = regexp.MustCompile(`errors: (\d+)`)
	statesRE = regexp.MustCompile(`(\d+) states, stored`)
	stepRE   = regexp.MustCompile(`(?m)^\s*MSC: (.*)$`)
)

// check generates, builds and runs the verifier of src with defines in a
// temp dir, bounded in time and memory.
// A variant that must fail is searched again and again for a shorter
// counterexample (-i), so the trail logged is the shortest.
func check(t *testing.T, spin, cc string, src []byte, defines []string, shortest bool) result {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "fleet.pml"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	var flags []string
	for _, d := range defines {
		flags = append(flags, "-D"+d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := func(name string, args ...string) []byte {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil && name != "./pan" {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return out
	}
	run(spin, append(append([]string{"-a"}, flags...), "fleet.pml")...)
	// -DSAFETY: invariants only; COLLAPSE compresses the stored states
	// (two losses: 7.6M states, ~500 MB); MEMLIM bounds them (MB).
	run(cc, "-O2", "-w", "-DSAFETY", "-DCOLLAPSE", "-DMEMLIM=1024", "-o", "pan", "pan.c")
	began := time.Now()
	args := []string{"-m200000"}
	if shortest {
		args = append(args, "-i")
	}
	out := run("./pan", args...)
	res := result{out: out, elapsed: time.Since(began).Round(time.Millisecond)}
	m := errorsRE.FindSubmatch(out)
	if m == nil {
		t.Fatalf("pan reported no result:\n%s", out)
	}
	res.errors, _ = strconv.Atoi(string(m[1]))
	if m := statesRE.FindSubmatch(out); m != nil {
		res.states, _ = strconv.Atoi(string(m[1]))
	}
	res.complete = !bytes.Contains(out, []byte("Search not completed")) && !bytes.Contains(out, []byte("out of memory"))
	if res.errors > 0 {
		replay := run(spin, append(append([]string{"-t"}, flags...), "fleet.pml")...)
		var steps [][]byte
		for _, s := range stepRE.FindAllSubmatch(replay, -1) {
			steps = append(steps, s[1])
		}
		res.trail = bytes.Join(steps, []byte("\n"))
	}
	return res
}
