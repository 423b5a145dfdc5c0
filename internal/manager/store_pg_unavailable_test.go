package manager

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ctld/ctld/internal/errdefs"
)

// TestPgUnavailableConnClosed: a connection that pgx closed earlier in
// the same operation is a lost connection (503 with a retry hint), not an
// internal error. The error is wrapped as pgx v5 wraps it when a BEGIN
// runs on a pooled connection whose server restarted.
func TestPgUnavailableConnClosed(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("begin transaction: %w", fmt.Errorf("failed to deallocate cached statement(s): %w", pgconn.ErrConnClosed)),
		fmt.Errorf("read: %w", io.EOF),
		fmt.Errorf("record node node-a: %w", errors.Join(driver.ErrBadConn, pgconn.ErrConnClosed)),
	} {
		got := pgLost(err)
		var e *errdefs.Error
		if errdefs.CodeOf(got) != errdefs.CodeUnavailable || !errors.As(got, &e) || e.RetryAfter <= 0 || !errors.Is(got, ErrDatabaseLost) {
			t.Errorf("pgUnavailable(%v) = %v, want unavailable with a retry hint", err, got)
		}
	}
	if other := errors.New("some other failure"); pgLost(other) != other {
		t.Errorf("pgLost passed a plain error as %v", pgLost(other))
	}
	// Inside the driver a bad connection passes as it is: database/sql
	// retries it on a fresh connection.
	if bad := fmt.Errorf("prepare: %w", driver.ErrBadConn); pgUnavailable(bad) != bad {
		t.Errorf("pgUnavailable classified a bad connection: %v", pgUnavailable(bad))
	}
}
