// Package pgtest starts a real PostgreSQL server for a test: Debian's
// binaries (installed by test/pg/setup.sh), initdb and postgres in a temp
// dir, listening only on a Unix socket there. PostgreSQL refuses to run
// as root, so a root test runs it as the postgres account Debian's
// package creates (or $CTLD_PG_USER). Missing binaries are a failure, not
// a skip: a backend that was not exercised is not proven.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"
)

// Server is a PostgreSQL server the test started; the test's cleanup stops
// it and fails the test if any of its processes is left.
type Server struct {
	// Dir holds the data dir, the socket and the server's log.
	Dir     string
	Version string // e.g. "15"
	Pid     int
	bin     string
	cred    *syscall.Credential
	sock    string
	exited  chan error // nil while stopped
	dbs     atomic.Int64
}

// BinDir finds the directory of Debian's initdb and postgres:
// $CTLD_PG_BIN, else the newest /usr/lib/postgresql/<major>/bin.
func BinDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("CTLD_PG_BIN"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err != nil {
			t.Fatalf("PostgreSQL: CTLD_PG_BIN=%s has no postgres binary: %v", d, err)
		}
		return d
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	sort.Slice(found, func(i, j int) bool { return major(found[i]) < major(found[j]) })
	if len(found) == 0 {
		t.Fatalf("PostgreSQL server not installed (no /usr/lib/postgresql/*/bin/postgres): run test/pg/setup.sh (make test-unit does)")
	}
	return filepath.Dir(found[len(found)-1])
}

func major(postgresBin string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(postgresBin))))
	return n
}

// runAs is the account the server runs as: nil for the test's own, the
// postgres account (or $CTLD_PG_USER) when the test is root.
func runAs(t testing.TB) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	name := os.Getenv("CTLD_PG_USER")
	if name == "" {
		name = "postgres"
	}
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatalf("PostgreSQL refuses to run as root and account %s is missing (%v): run test/pg/setup.sh", name, err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	if uid == 0 {
		t.Fatalf("PostgreSQL: account %s is root", name)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// Start initializes a cluster in a fresh temp dir and starts postgres on
// it. fsync is off: a test's database need not survive a power cut, and a
// loaded build machine runs the suite much faster without it.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := BinDir(t)
	cred := runAs(t)
	// Not t.TempDir: its parents are 0700 root, which the postgres
	// account cannot cross.
	dir, err := os.MkdirTemp("", "ctld-pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, sock := filepath.Join(dir, "data"), filepath.Join(dir, "sock")
	for _, d := range []string{data, sock} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if cred != nil {
			if err := os.Chown(d, int(cred.Uid), int(cred.Gid)); err != nil {
				t.Fatal(err)
			}
		}
	}
	logf, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "ctld", "--auth=trust", "--no-locale", "-E", "UTF8", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Stdout, initdb.Stderr = logf, logf
	if err := initdb.Run(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, readLog(dir))
	}
	s := &Server{Dir: dir, Version: filepath.Base(filepath.Dir(bin)), bin: bin, cred: cred, sock: sock}
	t.Cleanup(func() { s.Stop(t) })
	s.Restart(t)
	return s
}

// Restart starts the (stopped) server again on its data: what a database
// restart looks like to its clients.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if s.exited != nil {
		t.Fatalf("postgres (pid %d) is running", s.Pid)
	}
	logf, err := os.OpenFile(filepath.Join(s.Dir, "postgres.log"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", filepath.Join(s.Dir, "data"), "-k", s.sock,
		"-c", "listen_addresses=", "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off", "-c", "max_connections=200")
	// Its own process group: Stop checks the whole group is gone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	s.Pid = cmd.Process.Pid
	s.exited = make(chan error, 1)
	go func() { s.exited <- cmd.Wait() }()
	if err := s.waitReady(60 * time.Second); err != nil {
		t.Fatalf("postgres %s in %s: %v\n%s", s.Version, s.Dir, err, readLog(s.Dir))
	}
	t.Logf("pgtest: PostgreSQL %s (pid %d) on %s, running as uid %d", s.Version, s.Pid, s.sock, uidOf(s.cred))
}

func uidOf(c *syscall.Credential) int {
	if c == nil {
		return os.Geteuid()
	}
	return int(c.Uid)
}

func readLog(dir string) string {
	b, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
	return string(b)
}

// DSN is the URL of database db on the server.
func (s *Server) DSN(db string) string {
	q := url.Values{"host": {s.sock}, "user": {"ctld"}, "sslmode": {"disable"}}
	return (&url.URL{Scheme: "postgres", Path: "/" + db, RawQuery: q.Encode()}).String()
}

func (s *Server) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		select {
		case err := <-s.exited:
			s.exited <- err
			return fmt.Errorf("postgres exited before it was ready: %v", err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err == nil {
			err = c.Ping(ctx)
			c.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %v: %v", limit, last)
}

// NewDatabase creates a fresh, empty database and returns its URL.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("test_%d", s.dbs.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		t.Fatalf("connect to postgres: %v", err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	return s.DSN(name)
}

// Stop shuts the server down (fast shutdown: SIGINT; SIGKILL if it hangs)
// and fails the test if a process of its group is left. Stopping a
// stopped server does nothing.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if s.exited == nil {
		return
	}
	defer func() { s.exited = nil }()
	syscall.Kill(s.Pid, syscall.SIGINT)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		t.Errorf("postgres (pid %d) did not stop in 30 s after SIGINT: killing its group", s.Pid)
		syscall.Kill(-s.Pid, syscall.SIGKILL)
		<-s.exited
	}
	// The postmaster waits for its children before it exits; give a
	// straggler a moment, then any member of the group is a leak.
	var err error
	for range 50 {
		if err = unix.Kill(-s.Pid, 0); errors.Is(err, unix.ESRCH) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	syscall.Kill(-s.Pid, syscall.SIGKILL)
	t.Errorf("postgres left processes in its group %d after it stopped (kill -0: %v)", s.Pid, err)
}

// Leftover reports whether any process of the server's group still runs
// (for tests that check the cleanup itself).
func (s *Server) Leftover() bool {
	return !errors.Is(unix.Kill(-s.Pid, 0), unix.ESRCH)
}
