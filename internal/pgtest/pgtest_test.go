package pgtest

import (
	"context"
	"os"
	"strconv"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestStartServesAndStopsClean: the server answers on its socket, runs as
// a non-root account, and the cleanup leaves no process and no files.
func TestStartServesAndStopsClean(t *testing.T) {
	var srv *Server
	t.Run("serve", func(t *testing.T) {
		srv = Start(t)
		ctx := context.Background()
		c, err := pgx.Connect(ctx, srv.NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		var version string
		if err := c.QueryRow(ctx, `SHOW server_version`).Scan(&version); err != nil {
			t.Fatal(err)
		}
		// /proc/<pid> belongs to the process's effective uid.
		st, err := os.Stat("/proc/" + strconv.Itoa(srv.Pid))
		if err != nil {
			t.Fatal(err)
		}
		if uid := st.Sys().(*syscall.Stat_t).Uid; uid == 0 {
			t.Fatalf("postgres (pid %d) runs as root", srv.Pid)
		}
		t.Logf("server_version %s", version)
	})
	if srv == nil {
		t.FailNow()
	}
	if srv.Leftover() {
		t.Fatalf("processes of postgres' group %d left after the cleanup", srv.Pid)
	}
	if _, err := os.Stat(srv.Dir); !os.IsNotExist(err) {
		t.Fatalf("%s left after the cleanup: %v", srv.Dir, err)
	}
}
