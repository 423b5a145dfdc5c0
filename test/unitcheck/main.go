// Command unitcheck reads `go test -json` on stdin and prints what a
// reader of the unit stage needs: each package's result line, the whole
// output of every failed test, and the skips. A skip is a failure unless
// its message matches -allow (the kernel tests' own skip on the host,
// from internal/ktest): a test that did not run proves nothing, so a
// missing tool or file must show as a failure, not pass quietly.
//
//	go test -json ./... | go run ./test/unitcheck -allow 'kernel test: needs root in the test VM'
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
)

// event is one line of test2json (go doc test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Output     string
}

type result struct {
	passed, allowedSkips int
	failed, skipped      []string // "pkg TestName: reason"
	failedPkgs           []string
}

func main() {
	allow := flag.String("allow", "", "regexp: a skip whose output matches it is expected")
	flag.Parse()
	var re *regexp.Regexp
	if *allow != "" {
		var err error
		if re, err = regexp.Compile(*allow); err != nil {
			fmt.Fprintf(os.Stderr, "unitcheck: -allow: %v\n", err)
			os.Exit(2)
		}
	}
	r, err := check(os.Stdin, os.Stdout, re)
	if err != nil {
		fmt.Fprintf(os.Stderr, "unitcheck: %v\n", err)
		os.Exit(2)
	}
	if !summary(os.Stdout, r) {
		os.Exit(1)
	}
}

// check reads the events from in and prints to out as they come:
// package result lines, build errors and failed tests' output.
func check(in io.Reader, out io.Writer, allow *regexp.Regexp) (result, error) {
	var r result
	logs := map[string]*strings.Builder{} // package + test → its output
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(out, "%s\n", line) // not an event: go's own message
			continue
		}
		key := e.Package + " " + e.Test
		switch {
		case e.Action == "build-output":
			fmt.Fprint(out, e.Output)
		case e.Action == "build-fail":
			r.failedPkgs = append(r.failedPkgs, e.ImportPath+" (build)")
		case e.Test == "":
			// Package level: keep the result lines ("ok", "FAIL", "?")
			// and what the binary printed outside a test.
			if e.Action == "output" && !isNoise(e.Output) {
				fmt.Fprint(out, e.Output)
			}
			if e.Action == "fail" {
				r.failedPkgs = append(r.failedPkgs, e.Package)
			}
		case e.Action == "output":
			b := logs[key]
			if b == nil {
				b = &strings.Builder{}
				logs[key] = b
			}
			if b.Len() < 1<<20 { // a runaway test's output is cut
				b.WriteString(e.Output)
			}
		case e.Action == "pass":
			r.passed++
			delete(logs, key)
		case e.Action == "fail":
			if b := logs[key]; b != nil {
				fmt.Fprint(out, b.String())
			}
			r.failed = append(r.failed, e.Package+" "+e.Test)
			delete(logs, key)
		case e.Action == "skip":
			text := ""
			if b := logs[key]; b != nil {
				text = b.String()
			}
			if allow != nil && allow.MatchString(text) {
				r.allowedSkips++
			} else {
				fmt.Fprintf(out, "--- unexpected SKIP: %s %s\n%s", e.Package, e.Test, text)
				r.skipped = append(r.skipped, fmt.Sprintf("%s %s: %s", e.Package, e.Test, reason(text)))
			}
			delete(logs, key)
		}
	}
	return r, sc.Err()
}

// isNoise is package-level output a reader does not need: the per-test
// progress lines test2json gets because it runs tests verbosely.
func isNoise(s string) bool {
	for _, p := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME", "PASS\n", "FAIL\n", "testing: warning: no tests to run"} {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// reason is a skip's message: its output without the progress lines.
func reason(text string) string {
	var parts []string
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- SKIP") {
			continue
		}
		parts = append(parts, l)
	}
	return strings.Join(parts, " / ")
}

// summary prints the totals and what failed; false if anything did.
func summary(out io.Writer, r result) bool {
	fmt.Fprintf(out, "unitcheck: %d passed, %d failed, %d kernel tests skipped on the host (they run in the VM), %d unexpected skips\n",
		r.passed, len(r.failed), r.allowedSkips, len(r.skipped))
	sort.Strings(r.failed)
	for _, f := range r.failed {
		fmt.Fprintf(out, "  FAIL %s\n", f)
	}
	for _, p := range r.failedPkgs {
		fmt.Fprintf(out, "  FAIL package %s\n", p)
	}
	for _, s := range r.skipped {
		fmt.Fprintf(out, "  SKIP (not allowed) %s\n", s)
	}
	return len(r.failed) == 0 && len(r.failedPkgs) == 0 && len(r.skipped) == 0
}
