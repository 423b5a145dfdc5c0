package guestlog

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// shimEnv switches the test binary into the log writer (see TestMain), so
// Shim.Start runs the real Run in a child process.
const shimEnv = "GUESTLOG_TEST_SHIM"

func TestMain(m *testing.M) {
	if os.Getenv(shimEnv) == "1" {
		os.Exit(shimMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// shimMain parses the flags Shim.Start appends: --dir D --max-bytes N.
func shimMain(args []string) int {
	var cfg Config
	for i := 0; i+1 < len(args); i += 2 {
		switch args[i] {
		case "--dir":
			cfg.Dir = args[i+1]
		case "--max-bytes":
			cfg.Max, _ = strconv.ParseInt(args[i+1], 10, 64)
		}
	}
	cfg.CapEvery = 50 * time.Millisecond
	if err := Run(context.Background(), os.Stdin, cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func size(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// lines writes n numbered lines "line <i>\n".
func lines(from, n int) []byte {
	var b bytes.Buffer
	for i := from; i < from+n; i++ {
		fmt.Fprintf(&b, "line %07d\n", i)
	}
	return b.Bytes()
}

func TestRingKeepsLatestWithinCap(t *testing.T) {
	dir := t.TempDir()
	const max = 16 << 10
	r := &Ring{Dir: dir, Name: InitName, Max: max}
	// 100 times the cap, in writes of odd sizes.
	data := lines(0, 100*max/13)
	for p := data; len(p) > 0; {
		n := min(len(p), 777)
		if w, err := r.Write(p[:n]); w != n || err != nil {
			t.Fatalf("write: %d, %v", w, err)
		}
		p = p[n:]
	}
	r.Close()
	cur, old := size(t, filepath.Join(dir, InitName)), size(t, filepath.Join(dir, InitName+OldSuffix))
	if cur > max/2 || old > max/2 {
		t.Fatalf("halves %d and %d bytes, want each <= %d", cur, old, max/2)
	}
	got, err := Tail(dir, InitName, max)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(got)) < max/2 || !bytes.HasSuffix(data, got) {
		t.Fatalf("log holds %d bytes; want the latest output (at least %d bytes, a suffix of what was written)", len(got), max/2)
	}
	if last := LastLines(got, 1); string(last) != fmt.Sprintf("line %07d\n", 100*max/13-1) {
		t.Fatalf("last line %q", last)
	}
}

func TestRingReportsDroppedOutput(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "gone")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	r := &Ring{Dir: sub, Name: InitName, Max: MinMax}
	r.Write([]byte("before\n"))
	r.Close()
	if err := os.RemoveAll(sub); err != nil {
		t.Fatal(err)
	}
	// The directory is gone: output is dropped, Write still succeeds.
	if n, err := r.Write([]byte("lost\n")); n != 5 || err != nil {
		t.Fatalf("write into a removed dir: %d, %v; want it swallowed", n, err)
	}
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	r.Write([]byte("after\n"))
	r.Close()
	b, _ := os.ReadFile(filepath.Join(sub, InitName))
	if !strings.Contains(string(b), "[ctld: 5 bytes of output dropped") || !strings.HasSuffix(string(b), "after\n") {
		t.Fatalf("log after drops: %q", b)
	}
}

func TestCapCopiesTailAndTruncates(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, RunscName)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := lines(0, 3000) // 39000 bytes
	f.Write(data)
	if err := Cap(p, 64<<10); err != nil || size(t, p) != int64(len(data)) {
		t.Fatalf("under the cap: size %d, %v; want untouched", size(t, p), err)
	}
	if err := Cap(p, 16<<10); err != nil {
		t.Fatal(err)
	}
	if size(t, p) != 0 || size(t, p+OldSuffix) != 8<<10 {
		t.Fatalf("after cap: %d and %d bytes, want 0 and %d", size(t, p), size(t, p+OldSuffix), 8<<10)
	}
	old, _ := os.ReadFile(p + OldSuffix)
	if !bytes.HasSuffix(data, old) {
		t.Fatal("old half is not the latest output")
	}
	// The O_APPEND writer carries on at the new end, not at its old offset.
	f.Write([]byte("next\n"))
	if b, _ := os.ReadFile(p); string(b) != "next\n" {
		t.Fatalf("after truncation the appender wrote %q (%d bytes)", b[:min(len(b), 20)], len(b))
	}
	if err := Cap(filepath.Join(dir, "missing"), 1); err != nil {
		t.Fatalf("cap of a missing file: %v", err)
	}
}

func TestLastLines(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"a\nb\nc\n", 2, "b\nc\n"},
		{"a\nb\nc", 2, "b\nc"},
		{"a\nb\nc\n", 5, "a\nb\nc\n"},
		{"a\nb\nc\n", 0, "a\nb\nc\n"},
		{"", 3, ""},
	} {
		if got := LastLines([]byte(tc.in), tc.n); string(got) != tc.want {
			t.Errorf("LastLines(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestFollowAcrossRotationAndTruncation(t *testing.T) {
	dir := t.TempDir()
	const max = MinMax
	r := &Ring{Dir: dir, Name: InitName, Max: max}
	defer r.Close()
	first := lines(0, 100)
	r.Write(first)
	got, fl, err := Follow(dir, InitName)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	if !bytes.Equal(got, first) {
		t.Fatalf("initial content %d bytes, want %d", len(got), len(first))
	}
	if b, err := fl.Next(1 << 20); err != nil || len(b) != 0 {
		t.Fatalf("nothing new: %q, %v", b, err)
	}
	// Enough to rotate once between two reads: the follower drains the
	// rotated half it holds, then moves on to the new one.
	more := lines(100, 300)
	r.Write(more)
	var seen []byte
	for i := 0; i < 10; i++ {
		b, err := fl.Next(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, b...)
	}
	if !bytes.Equal(seen, more) {
		t.Fatalf("followed %d bytes, want the %d written (rotated at %d)", len(seen), len(more), max/2)
	}

	// Cap's truncation: the follower starts the file over.
	p := filepath.Join(dir, RunscName)
	os.WriteFile(p, lines(0, 2000), 0o600)
	_, fr, err := Follow(dir, RunscName)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.Close()
	if err := Cap(p, max); err != nil {
		t.Fatal(err)
	}
	f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	f.Write([]byte("after truncate\n"))
	f.Close()
	if b, err := fr.Next(1 << 20); err != nil || string(b) != "after truncate\n" {
		t.Fatalf("after truncation followed %q, %v", b, err)
	}
}

func TestDirs(t *testing.T) {
	root := t.TempDir()
	d := Dirs{Root: root}
	if err := d.Make("sb-g1"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(d.Dir("sb-g1"), InitName), []byte("x"), 0o600)
	// Files of the layout before per-generation directories, and runsc's
	// log for commands about no container.
	for _, f := range []string{"old-g3.log", "old-g3.init.log", "runsc.log"} {
		os.WriteFile(filepath.Join(root, f), nil, 0o600)
	}
	os.Mkdir(filepath.Join(root, "old-g4.debug"), 0o700)
	valid := func(s string) bool { return strings.Contains(s, "-g") }
	ids, err := d.List(valid)
	if err != nil || strings.Join(ids, ",") != "old-g3,old-g4,sb-g1" {
		t.Fatalf("list: %q, %v", ids, err)
	}
	if ok, detail := d.CheckGone("sb-g1"); ok || !strings.Contains(detail, d.Dir("sb-g1")) {
		t.Fatalf("check gone of a present dir: %v %s", ok, detail)
	}
	for _, id := range ids {
		if err := d.Remove(id); err != nil {
			t.Fatal(err)
		}
		if ok, detail := d.CheckGone(id); !ok {
			t.Fatalf("after remove %s: %s", id, detail)
		}
	}
	if err := d.Remove("sb-g1"); err != nil {
		t.Fatalf("remove twice: %v", err)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 1 || ents[0].Name() != "runsc.log" {
		t.Fatalf("left in root: %v", ents)
	}
}

// TestShimBoundsAFloodAndExitsAtEOF runs the writer as its own process, as
// ctld does: far more output than the cap leaves at most the cap on disk,
// the latest lines are there, runsc's log is capped meanwhile, and the
// writer exits once the last write end is closed.
func TestShimBoundsAFloodAndExitsAtEOF(t *testing.T) {
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const max = 64 << 10
	s := Shim{Argv: []string{self}, Max: max, Env: []string{shimEnv + "=1"}}
	w, wr, err := s.Start(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	// runsc appends to its own log meanwhile.
	rl, err := os.OpenFile(filepath.Join(dir, RunscName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	const n = 200000 // 2.6 MB, 40 times the cap
	for i := 0; i < n; i += 1000 {
		if _, err := w.Write(lines(i, 1000)); err != nil {
			t.Fatal(err)
		}
		rl.Write(lines(i, 100))
		if i%20000 == 0 {
			time.Sleep(60 * time.Millisecond) // let the writer's cap tick run
		}
		if s := size(t, filepath.Join(dir, InitName)) + size(t, filepath.Join(dir, InitName+OldSuffix)); s > max {
			t.Fatalf("init log holds %d bytes while the guest writes, cap %d", s, max)
		}
	}
	w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := wr.Wait(ctx); err != nil {
		t.Fatalf("writer did not exit cleanly at EOF: %v", err)
	}
	total := size(t, filepath.Join(dir, InitName)) + size(t, filepath.Join(dir, InitName+OldSuffix))
	if total > max || total < max/2 {
		t.Fatalf("init log holds %d bytes, want between %d and %d", total, max/2, max)
	}
	tail, _ := Tail(dir, InitName, max)
	if last := LastLines(tail, 1); string(last) != fmt.Sprintf("line %07d\n", n-1) {
		t.Fatalf("last line %q, want the last one written", last)
	}
	if rs := size(t, filepath.Join(dir, RunscName)); rs > max {
		t.Fatalf("runsc log %d bytes after the writer's final cap, want <= %d", rs, max)
	}
}

func TestShimRefusesBadConfig(t *testing.T) {
	if _, _, err := (Shim{Max: MinMax}).Start(t.TempDir(), ""); err == nil {
		t.Error("started without a command")
	}
	if _, _, err := (Shim{Argv: []string{"/bin/true"}, Max: 1}).Start(t.TempDir(), ""); err == nil {
		t.Error("started with a cap below the minimum")
	}
	if err := Run(context.Background(), strings.NewReader(""), Config{Dir: t.TempDir(), Max: 10}); err == nil {
		t.Error("ran with a cap below the minimum")
	}
	var _ io.Writer = &Ring{}
}
