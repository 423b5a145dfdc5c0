package runsc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/guestlog"
)

// fakeRunsc is a shell script standing in for runsc: it appends each call's
// arguments to a calls file and answers like runsc 20221219 does, with the
// containers of the fake "kernel" being files in a dir.
const fakeRunsc = `#!/bin/sh
calls="$FAKE_DIR/calls"
echo "$*" >> "$calls"
while [ $# -gt 0 ]; do case "$1" in --*) shift;; *) break;; esac; done
cmd=$1; shift
last=$(for a in "$@"; do :; done; echo "$a")
notexist() { echo "loading container: file does not exist" >&2; exit 128; }
case "$cmd" in
create)
	# Report what the container's init would inherit as stdio.
	echo "stdin=$(readlink /proc/$$/fd/0) stdout=$(readlink /proc/$$/fd/1)" >> "$FAKE_DIR/stdio"
	[ "$(cut -d' ' -f6 /proc/self/stat)" = "$$" ] && echo "session-leader" >> "$FAKE_DIR/stdio"
	if [ -e "$FAKE_DIR/fail-create" ]; then echo "creating container: boom" >&2; exit 128; fi
	touch "$FAKE_DIR/c-$last";;
start) [ -e "$FAKE_DIR/c-$last" ] || notexist;;
state)
	[ -e "$FAKE_DIR/c-$last" ] || notexist
	printf '{"ociVersion":"1.0.2-dev","id":"%s","status":"running","pid":42,"bundle":"/b"}' "$last";;
exec)
	[ -e "$FAKE_DIR/c-$last" ] || { echo "loading sandbox: file does not exist" >&2; exit 128; }
	echo out-line; echo err-line >&2; cat > "$FAKE_DIR/stdin"; exit "${FAKE_EXEC_CODE:-0}";;
kill) [ -e "$FAKE_DIR/c-$1" ] || [ -e "$FAKE_DIR/c-$2" ] || notexist;;
delete) rm -f "$FAKE_DIR/c-$last";;
list) for f in "$FAKE_DIR"/c-*; do [ -e "$f" ] && echo "${f##*/c-}"; done; true;;
*) echo "unknown $cmd" >&2; exit 2;;
esac
`

func newFake(t *testing.T) (*Runtime, string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "runsc")
	if err := os.WriteFile(bin, []byte(fakeRunsc), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("FAKE_DIR", dir)
	root := filepath.Join(dir, "root")
	// The fake reads its settings from the environment, which runsc no
	// longer inherits: pass it on (tests that change it set Env again).
	return &Runtime{Binary: bin, Root: root, LogDir: filepath.Join(dir, "logs"), Env: os.Environ()}, dir
}

func calls(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "calls"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func TestGlobalArgs(t *testing.T) {
	r := &Runtime{Root: "/run/ctld/runsc"}
	want := []string{"--root=/run/ctld/runsc", "--network=sandbox", "--overlay2=none", "--log=/run/ctld/runsc.logs/c1/runsc.log", "--panic-log=/run/ctld/runsc.logs/c1/panic.log"}
	if got := r.GlobalArgs("c1"); !slices.Equal(got, want) {
		t.Errorf("defaults: %q, want %q", got, want)
	}
	r = &Runtime{Root: "/r", LogDir: "/l", Platform: "kvm", Network: "none", IgnoreCgroups: true, HostUDS: "create", Debug: true}
	want = []string{"--root=/r", "--platform=kvm", "--network=none", "--overlay2=none", "--log=/l/c1/runsc.log", "--panic-log=/l/c1/panic.log", "--ignore-cgroups", "--host-uds=create", "--debug", "--debug-log=/l/c1/debug/"}
	if got := r.GlobalArgs("c1"); !slices.Equal(got, want) {
		t.Errorf("all set: %q, want %q", got, want)
	}
	r.Version = CurrentVersion
	if got := r.GlobalArgs("c1"); !slices.Contains(got, "--gofer-network-namespace=new") {
		t.Errorf("current build: %q, want its gofers in netns of their own", got)
	}
	r.Version = DebianVersion
	if got := r.GlobalArgs("c1"); !slices.Equal(got, want) {
		t.Errorf("Debian's build: %q, want %q (it has no --gofer-network-namespace)", got, want)
	}
	if got := r.GlobalArgs(""); got[4] != "--log=/l/runsc.log" || slices.Contains(got, "--debug") || strings.Contains(strings.Join(got, " "), "--panic-log") {
		t.Errorf("no container: %q", got)
	}
}

func TestRunscLifecycleFake(t *testing.T) {
	r, dir := newFake(t)
	ctx := context.Background()
	if err := r.Create(ctx, "c1", "/bundles/c1"); err != nil {
		t.Fatal(err)
	}
	stdio, err := os.ReadFile(filepath.Join(dir, "stdio"))
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox inherits create's stdio: it must be /dev/null and the init
	// log file, never a pipe that dies with us; and it runs in its own session.
	wantStdio := "stdin=/dev/null stdout=" + r.InitLogFile("c1") + "\nsession-leader\n"
	if string(stdio) != wantStdio {
		t.Errorf("create stdio:\n%s\nwant:\n%s", stdio, wantStdio)
	}
	if err := r.Start(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	st, err := r.State(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	if st != (State{ID: "c1", Status: "running", Pid: 42, Bundle: "/b"}) {
		t.Errorf("state = %+v", st)
	}
	var out, errb bytes.Buffer
	code, err := r.Exec(ctx, "c1", ExecProcess{Args: []string{"echo", "hi"}}, strings.NewReader("in-data"), &out, &errb)
	if err != nil || code != 0 {
		t.Fatalf("exec: code %d err %v", code, err)
	}
	if out.String() != "out-line\n" || errb.String() != "err-line\n" {
		t.Errorf("exec output %q / %q", out.String(), errb.String())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "stdin")); string(b) != "in-data" {
		t.Errorf("exec stdin = %q", b)
	}
	t.Setenv("FAKE_EXEC_CODE", "3")
	r.Env = os.Environ()
	if code, err := r.Exec(ctx, "c1", ExecProcess{Args: []string{"false"}}, nil, &out, &errb); err != nil || code != 3 {
		t.Errorf("exec exit 3: code %d err %v", code, err)
	}
	// 128 from a container that is there is the guest's code.
	t.Setenv("FAKE_EXEC_CODE", "128")
	r.Env = os.Environ()
	if code, err := r.Exec(ctx, "c1", ExecProcess{Args: []string{"x"}}, nil, &out, &errb); err != nil || code != 128 {
		t.Errorf("exec exit 128: code %d err %v", code, err)
	}
	if err := r.Kill(ctx, "c1", syscall.SIGTERM, true); err != nil {
		t.Fatal(err)
	}
	if ids, err := r.List(ctx); err != nil || !slices.Equal(ids, []string{"c1"}) {
		t.Errorf("list = %q, %v", ids, err)
	}
	for range 2 {
		if err := r.Delete(ctx, "c1"); err != nil {
			t.Fatal(err)
		}
	}
	if ids, err := r.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("list after delete = %q, %v", ids, err)
	}

	want := []string{
		"create --bundle /bundles/c1 c1",
		"start c1",
		"state c1",
		"exec --process",
		"exec --process",
		"exec --process",
		"state c1", // exit 128: is the container still there?
		"kill --all c1 15",
		"list -quiet",
		"delete --force c1",
		"delete --force c1",
		"list -quiet",
	}
	got := calls(t, dir)
	if len(got) != len(want) {
		t.Fatalf("calls:\n%s", strings.Join(got, "\n"))
	}
	for i, c := range got {
		if !strings.HasPrefix(c, strings.Join(r.GlobalArgs(idOf(want[i])), " ")+" "+want[i]) {
			t.Errorf("call %d = %q, want global args + %q", i, c, want[i])
		}
	}
}

// idOf is the container a call in TestRunscLifecycleFake is about.
func idOf(call string) string {
	if strings.HasPrefix(call, "list") {
		return ""
	}
	return "c1"
}

func TestRunscNotExist(t *testing.T) {
	r, dir := newFake(t)
	ctx := context.Background()
	if _, err := r.State(ctx, "gone"); !errors.Is(err, ErrNotExist) {
		t.Errorf("state of missing container: %v, want ErrNotExist", err)
	}
	if err := r.Start(ctx, "gone"); !errors.Is(err, ErrNotExist) {
		t.Errorf("start of missing container: %v", err)
	}
	var out bytes.Buffer
	if code, err := r.Exec(ctx, "gone", ExecProcess{Args: []string{"true"}}, nil, &out, &out); !errors.Is(err, ErrNotExist) || code != -1 {
		t.Errorf("exec in missing container: code %d err %v", code, err)
	}
	if err := r.Delete(ctx, "gone"); err != nil {
		t.Errorf("delete of missing container: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "fail-create"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := r.Create(ctx, "c2", "/b")
	if err == nil || !strings.Contains(err.Error(), "creating container: boom") {
		t.Errorf("failed create error %v should quote runsc's message", err)
	}
	if err := r.Create(ctx, "../x", "/b"); err == nil {
		t.Error("create accepted a bad id")
	}
}

// TestCommandsRefuseBadID: a bad id reaches neither runsc (as an argument,
// "-x" a flag) nor the file system (as a log dir, "../x" outside the log
// root); the runtime contract's bad-id case on the real driver
// (node/guest/runtimetest).
func TestCommandsRefuseBadID(t *testing.T) {
	r, dir := newFake(t)
	ctx := context.Background()
	for _, id := range []string{"", "../x", "a/b", "-x"} {
		var out bytes.Buffer
		_, execErr := r.Exec(ctx, id, ExecProcess{Args: []string{"true"}}, nil, &out, &out)
		_, stateErr := r.State(ctx, id)
		for verb, err := range map[string]error{
			"start": r.Start(ctx, id), "kill": r.Kill(ctx, id, syscall.SIGKILL, true), "delete": r.Delete(ctx, id),
			"exec": execErr, "state": stateErr,
		} {
			if err == nil || !strings.Contains(err.Error(), "runsc "+verb+": ") {
				t.Errorf("%s %q: %v, want refused", verb, id, err)
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "calls")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("runsc ran for bad ids: %q, %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(r.LogRoot(), "..", "x")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a bad id made a dir outside the log root: %v", err)
	}
}

// TestCreateRefusesAnExistingContainer: a create of an id runsc has state
// of never runs runsc, whose failed create would delete that state and
// orphan the live guest (seen in the VM with real runsc; the runtime
// contract's create-twice case).
func TestCreateRefusesAnExistingContainer(t *testing.T) {
	r, dir := newFake(t)
	ctx := context.Background()
	if err := r.Create(ctx, "c1", "/bundles/c1"); err != nil {
		t.Fatal(err)
	}
	// The state file real runsc leaves (the fake script keeps its own).
	writeState(t, r, "c1", deadState("c1", os.Getpid(), os.Getpid()))
	before := calls(t, dir)
	if err := r.Create(ctx, "c1", "/bundles/c1"); !errors.Is(err, fs.ErrExist) {
		t.Errorf("second create: %v, want fs.ErrExist", err)
	}
	if after := calls(t, dir); len(after) != len(before) {
		t.Errorf("runsc ran for the second create: %q", after[len(before):])
	}
	if known, err := r.Known(); err != nil || !slices.Equal(known, []string{"c1"}) {
		t.Errorf("known after the refused create = %q, %v; want [c1]", known, err)
	}
}

func TestExecSpec(t *testing.T) {
	p, err := ExecSpec(ExecProcess{Args: []string{"id"}, UID: 65534, GID: 65534})
	if err != nil {
		t.Fatal(err)
	}
	if !p.NoNewPrivileges || p.Cwd != "/" || p.User.UID != 65534 || len(p.Capabilities.Effective) != 0 || !slices.Equal(p.Capabilities.Bounding, Capabilities) {
		t.Errorf("process = %+v caps %+v", p, p.Capabilities)
	}
	if !hasEnv(p.Env, "PATH") {
		t.Errorf("env %q lacks PATH", p.Env)
	}
	for _, bad := range []ExecProcess{{}, {Args: []string{""}}, {Args: []string{"x"}, Cwd: "rel"}, {Args: []string{"x"}, Env: []string{"NOEQ"}}} {
		if _, err := ExecSpec(bad); err == nil {
			t.Errorf("accepted %+v", bad)
		}
	}
}

func TestParseState(t *testing.T) {
	s, err := ParseState([]byte(`{"ociVersion":"1.0.2-dev","id":"c1","status":"stopped","pid":-1,"bundle":"/b"}`))
	if err != nil || s != (State{ID: "c1", Status: "stopped", Pid: -1, Bundle: "/b"}) {
		t.Errorf("state %+v err %v", s, err)
	}
	for _, bad := range []string{"", "null", "{}", "W1129 warning\n{"} {
		if _, err := ParseState([]byte(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

func TestParseVersion(t *testing.T) {
	v, err := ParseVersion("runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n")
	if err != nil || v != "0.0~20221219.0" {
		t.Errorf("version %q err %v", v, err)
	}
	if _, err := ParseVersion("something else"); err == nil {
		t.Error("accepted garbage")
	}
}

// A go-installed build says VERSION_MISSING: it is named by its module;
// a stamped release keeps its own name.
func TestModuleVersion(t *testing.T) {
	bi := &debug.BuildInfo{Main: debug.Module{Path: "gvisor.dev/gvisor", Version: "v0.0.0-20260905035102-160fafc42237"}}
	if v := ModuleVersion("VERSION_MISSING", bi); v != CurrentVersion {
		t.Errorf("go-installed build: %q, want %q", v, CurrentVersion)
	}
	if v := ModuleVersion("0.0~20221219.0", bi); v != "0.0~20221219.0" {
		t.Errorf("stamped build: %q", v)
	}
	if v := ModuleVersion("VERSION_MISSING", &debug.BuildInfo{Main: debug.Module{Path: "gvisor.dev/gvisor", Version: "(devel)"}}); v != "VERSION_MISSING" {
		t.Errorf("devel build: %q", v)
	}
}

// The platform flag's help of both builds: Debian's and the current one.
func TestParsePlatforms(t *testing.T) {
	for _, tc := range []struct{ out, def, all string }{
		{"  -platform string\n    \tspecifies which platform to use: ptrace (default), kvm. (default \"ptrace\")\n  -platform_device_path string\n", "ptrace", "ptrace kvm"},
		{"  -platform string\n    \tspecifies which platform to use: systrap (default), ptrace, kvm. (default \"systrap\")\n", "systrap", "systrap ptrace kvm"},
	} {
		def, all, err := ParsePlatforms(tc.out)
		if err != nil || def != tc.def || strings.Join(all, " ") != tc.all {
			t.Errorf("ParsePlatforms = %q, %q, %v; want %q, %q", def, all, err, tc.def, tc.all)
		}
	}
	if _, _, err := ParsePlatforms("no such flag"); err == nil {
		t.Error("accepted output without the platform flag")
	}
}

func TestOwnsCmdline(t *testing.T) {
	r := &Runtime{Root: "/run/ctld/runsc", LogDir: "/var/log/ctld"}
	sandbox := []string{"runsc-sandbox", "--root=/run/ctld/runsc", "--log=/var/log/ctld/c1/runsc.log", "--log-fd=3", "boot", "--bundle=/b", "c1"}
	gofer := []string{"runsc-gofer", "--root=/run/ctld/runsc", "--log=/var/log/ctld/c1/runsc.log", "--log-fd=3", "gofer", "--bundle", "/b"}
	// Gofers of containers made before per-container log directories.
	legacyGofer := []string{"runsc-gofer", "--root=/run/ctld/runsc", "--log=/var/log/ctld/c1.log", "--log-fd=3", "gofer", "--bundle", "/b"}
	for _, tc := range []struct {
		argv []string
		id   string
		want bool
	}{
		{sandbox, "c1", true},
		{gofer, "c1", true},
		{sandbox, "c2", false},
		{gofer, "c2", false},
		{legacyGofer, "c1", true},
		{legacyGofer, "c2", false},
		{[]string{"runsc-sandbox", "--root=/other", "boot", "c1"}, "c1", false},
		{[]string{"sleep", "--root=/run/ctld/runsc", "c1"}, "c1", false},
		{nil, "c1", false},
	} {
		if got := r.ownsCmdline(tc.argv, tc.id); got != tc.want {
			t.Errorf("ownsCmdline(%q, %s) = %v, want %v", tc.argv, tc.id, got, tc.want)
		}
	}
}

func TestStateFiles(t *testing.T) {
	root := t.TempDir()
	for _, n := range []string{"c1_sandbox:c1.state", "c1_sandbox:c1.lock", "c10_sandbox:c10.state"} {
		if err := os.WriteFile(filepath.Join(root, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := stateFiles(root, "c1")
	if err != nil || !slices.Equal(got, []string{"c1_sandbox:c1.lock", "c1_sandbox:c1.state"}) {
		t.Errorf("state files %q err %v", got, err)
	}
	if got, err := stateFiles(filepath.Join(root, "missing"), "c1"); err != nil || got != nil {
		t.Errorf("missing root: %q %v", got, err)
	}
}

// TestInitOutputAndLogCap: with InitOutput the init's stdio is the given
// pipe (to a bounded log writer), a failed create still quotes runsc's
// error once the writer has it, and LogMaxBytes caps runsc's own log
// before every command.
func TestInitOutputAndLogCap(t *testing.T) {
	r, dir := newFake(t)
	r.LogMaxBytes = guestlog.MinMax
	var opened []string
	r.InitOutput = func(id string) (*os.File, func(context.Context) error, error) {
		opened = append(opened, id)
		pr, pw, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		done := make(chan error, 1)
		go func() {
			defer pr.Close()
			ring := &guestlog.Ring{Dir: r.ContainerLogDir(id), Name: guestlog.InitName, Max: guestlog.MinMax}
			_, err := io.Copy(ring, pr)
			done <- errors.Join(err, ring.Close())
		}()
		return pw, func(ctx context.Context) error {
			select {
			case err := <-done:
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}, nil
	}
	ctx := context.Background()
	if err := r.Create(ctx, "c1", "/bundles/c1"); err != nil {
		t.Fatal(err)
	}
	stdio, _ := os.ReadFile(filepath.Join(dir, "stdio"))
	if !strings.Contains(string(stdio), "stdout=pipe:") || !slices.Equal(opened, []string{"c1"}) {
		t.Fatalf("create stdio %q (opened %q): want the InitOutput pipe", stdio, opened)
	}
	if err := os.WriteFile(filepath.Join(dir, "fail-create"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Create(ctx, "c2", "/b"); err == nil || !strings.Contains(err.Error(), "creating container: boom") {
		t.Fatalf("failed create error %v should quote runsc's message from the log", err)
	}
	// runsc's own log of c1, grown past the cap, is capped before the next command.
	big := bytes.Repeat([]byte("runsc log line\n"), 2*guestlog.MinMax/15)
	if err := os.WriteFile(r.logFile("c1"), big, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.State(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(r.logFile("c1")); err != nil || len(b) > guestlog.MinMax {
		t.Fatalf("runsc log after a command: %d bytes, %v; want capped at %d", len(b), err, guestlog.MinMax)
	}
	if b, err := os.ReadFile(r.logFile("c1") + guestlog.OldSuffix); err != nil || len(b) != guestlog.MinMax/2 {
		t.Fatalf("runsc log's old half: %d bytes, %v", len(b), err)
	}
}

// helperStdioDescriptions stands in for `runsc create`: it does what the
// sentry does to an imported stdio fd (make it non-blocking) to stdout and
// reports whether stderr became non-blocking too, i.e. shares stdout's open
// file description.
func helperStdioDescriptions() int {
	if err := unix.SetNonblock(1, true); err != nil {
		return 2
	}
	defer unix.SetNonblock(1, false)
	fl, err := unix.FcntlInt(2, unix.F_GETFL, 0)
	if err != nil {
		return 2
	}
	msg := fmt.Sprintf("stderr-nonblock=%v", fl&unix.O_NONBLOCK != 0)
	if err := os.WriteFile(os.Getenv("HELPER_OUT"), []byte(msg), 0o600); err != nil {
		return 2
	}
	return 0
}

// TestCreateGivesStdoutAndStderrTheirOwnDescriptions: the guest must see
// blocking stdout and stderr even though both go to one pipe (see Create).
func TestCreateGivesStdoutAndStderrTheirOwnDescriptions(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	t.Setenv(helperEnv, "stdio-descriptions")
	t.Setenv("HELPER_OUT", out)
	r := &Runtime{Binary: self, Root: filepath.Join(dir, "root"), LogDir: filepath.Join(dir, "logs"), Env: os.Environ()}
	pipe := func(string) (*os.File, func(context.Context) error, error) {
		pr, pw, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		go func() { io.Copy(io.Discard, pr); pr.Close() }()
		return pw, nil, nil
	}
	for name, output := range map[string]func(string) (*os.File, func(context.Context) error, error){"file": nil, "pipe": pipe} {
		r.InitOutput = output
		if err := r.Create(context.Background(), "c-"+name, "/b"); err != nil {
			t.Fatalf("%s: create: %v", name, err)
		}
		if b, err := os.ReadFile(out); err != nil || string(b) != "stderr-nonblock=false" {
			t.Fatalf("%s: %q, %v: stdout and stderr share one open file description", name, b, err)
		}
	}
}

// runsc does not inherit ctld's environment: its AWS_* credentials (the
// block store's) and anything else stay out of runsc and the sandbox and
// gofer processes it starts.
func TestCommandEnvIsMinimal(t *testing.T) {
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_ACCESS_KEY_ID", "id")
	t.Setenv("CTLD_SOMETHING", "x")
	r := &Runtime{Root: "/r"}
	cmd := r.command(context.Background(), "c1", "state", "c1")
	if cmd.Env == nil {
		t.Fatal("runsc's Env is nil: it inherits ctld's environment")
	}
	for _, e := range cmd.Env {
		if strings.HasPrefix(e, "AWS_") || strings.HasPrefix(e, "CTLD_") {
			t.Errorf("runsc's env has %q", e)
		}
	}
	if !hasEnv(cmd.Env, "PATH") {
		t.Errorf("runsc's env %q lacks PATH", cmd.Env)
	}
	r.Env = []string{"PATH=/x"}
	if got := r.command(context.Background(), "c1", "state", "c1").Env; !slices.Equal(got, []string{"PATH=/x"}) {
		t.Errorf("Runtime.Env: runsc's env %q", got)
	}
}

// TestPanicSummary: PanicSummary keeps the lines that say what crashed, bounded, and falls
// back to the first lines of a log that has none of them.
func TestPanicSummary(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "panic.log")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if s, err := PanicSummary(filepath.Join(dir, "none"), 4, 100); s != "" || err != nil {
		t.Fatalf("missing log: %q, %v", s, err)
	}
	p := write("\npanic: runtime error: index out of range [3] with length 3\n\ngoroutine 7 [running]:\n" + strings.Repeat("x.y()\n", 100000))
	if s, err := PanicSummary(p, 4, 1000); err != nil || s != "panic: runtime error: index out of range [3] with length 3" {
		t.Fatalf("panic: %q, %v", s, err)
	}
	p = write("something else\nand more\nthird\nfourth\nfifth\n")
	if s, _ := PanicSummary(p, 2, 1000); s != "something else\nand more" {
		t.Fatalf("no marker: %q", s)
	}
	p = write("fatal error: " + strings.Repeat("z", 5000) + "\n")
	if s, _ := PanicSummary(p, 4, 100); len(s) != 103 || !strings.HasPrefix(s, "fatal error: zz") {
		t.Fatalf("long line: %d bytes %.40q", len(s), s)
	}
}
