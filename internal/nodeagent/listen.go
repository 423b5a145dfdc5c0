package nodeagent

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ctld/ctld/internal/manager"
)

// listen LISTENs on the fleet's work channel over its own connection to
// the PostgreSQL database at dsn and signals wake for each notification
// naming nodeID, until ctx ends. A lost connection is dialed again after
// a pause (polling covers the gap). The channel has room for one signal:
// a burst of notifications wakes the loop once.
func listen(ctx context.Context, dsn, nodeID string, log *slog.Logger, wake chan<- struct{}) {
	const pause = time.Second
	for ctx.Err() == nil {
		err := listenOnce(ctx, dsn, nodeID, wake)
		if ctx.Err() != nil {
			return
		}
		// pgx's message may quote the URL: only the redacted one is logged.
		log.Warn("listen for placed work; polling meanwhile", "db", manager.RedactDSN(dsn), "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
}

func listenOnce(ctx context.Context, dsn, nodeID string, wake chan<- struct{}) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{manager.NodeWorkChannel}.Sanitize()); err != nil {
		return err
	}
	// Work placed while the connection was down is found by this wake.
	signal(wake)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Payload == nodeID {
			signal(wake)
		}
	}
}

func signal(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}
