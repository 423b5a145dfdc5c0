package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"
)

// Serve serves h on ln until ctx is done (then closes at once: a scrape
// or a profile has nothing to finish).
func Serve(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger) error {
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve metrics on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	err := hs.Close()
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// ListenAddr picks this slot's TCP address from --metrics-listen's
// entries: "SLOT=ADDR" is for that slot only, a bare "ADDR" for any slot
// that has no entry of its own (both instances of a pair on one host
// need their own port). "" means none.
func ListenAddr(entries []string, slot string) (string, error) {
	var any, own string
	for _, e := range entries {
		s, addr, ok := strings.Cut(e, "=")
		if !ok {
			addr = e
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return "", fmt.Errorf("--metrics-listen %q: want [SLOT=]HOST:PORT: %w", e, err)
		}
		switch {
		case !ok:
			any = addr
		case s != "a" && s != "b":
			return "", fmt.Errorf("--metrics-listen %q: slot must be a or b", e)
		case s == slot:
			own = addr
		}
	}
	if own != "" {
		return own, nil
	}
	return any, nil
}
