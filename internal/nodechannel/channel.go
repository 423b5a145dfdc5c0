// Package nodechannel is the fleet's stream channel (issue 24): how a
// manager replica reaches the sandboxes of another host for exec, files
// and logs. ctld's API socket never leaves its node; the node process
// (ctl-manager node run) serves this channel on TCP with mutual TLS under
// a cluster CA the operator provides, and passes the allowed calls, and
// only those, to its ctld's socket. A manager presents a client
// certificate of that CA and checks that the node's certificate is of
// the same CA and names the node's id (DNS SAN), so a replica talks to the
// node the database placed the sandbox on, and to nothing else.
package nodechannel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/logging"
)

// Files names the PEM files of one party of the channel: the cluster CA
// (the only issuer trusted) and this party's certificate and key.
type Files struct {
	CA, Cert, Key string
}

// Load reads the cluster CA and the certificate and key.
func Load(f Files) (*x509.CertPool, tls.Certificate, error) {
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("read cluster CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, tls.Certificate{}, fmt.Errorf("read cluster CA %s: no PEM certificate in it", f.CA)
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("load certificate %s: %w", f.Cert, err)
	}
	return pool, cert, nil
}

// ManagerURI is the identity a manager replica's client certificate must
// carry as a URI SAN (openssl: -addext subjectAltName=URI:urn:ctld:manager).
// The cluster CA issues the nodes' certificates too; one of those issued
// with clientAuth as well must not reach every other node's sandboxes.
const ManagerURI = "urn:ctld:manager"

// IsManager reports whether c names the manager identity (ManagerURI).
func IsManager(c *x509.Certificate) bool {
	for _, u := range c.URIs {
		if u.String() == ManagerURI {
			return true
		}
	}
	return false
}

// ServerTLS is the node's side: TLS 1.3, and a client certificate the
// cluster CA issued (for client authentication) naming the manager
// identity (ManagerURI) is required.
func ServerTLS(ca *x509.CertPool, cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    ca,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		// Runs after the chain is verified against the cluster CA.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !IsManager(cs.PeerCertificates[0]) {
				return fmt.Errorf("client certificate does not name the manager identity %s", ManagerURI)
			}
			return nil
		},
	}
}

// ClientTLS is a manager's side: its certificate, and only the cluster CA
// trusted for the nodes' certificates. Dialer names the node per call.
func ClientTLS(ca *x509.CertPool, cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		RootCAs:      ca,
	}
}

// Dialer dials node nodeID's channel at addr: the node's certificate must
// name nodeID (the handshake is part of the dial, bounded by ctx).
func Dialer(base *tls.Config) func(ctx context.Context, nodeID, addr string) (net.Conn, error) {
	return func(ctx context.Context, nodeID, addr string) (net.Conn, error) {
		conf := base.Clone()
		conf.ServerName = nodeID
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}, Config: conf}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("dial node %s channel at %s: %w", nodeID, addr, err)
		}
		return c, nil
	}
}

// Routes are the ctld calls the channel passes (method and ServeMux
// pattern): reading a sandbox, its streams and files, and a live network
// update. Claims, releases, pauses and everything else of the node are
// the node process's own work from the database, never a caller's.
var Routes = []string{
	"GET /v1/sandboxes/{id}",
	"POST /v1/sandboxes/{id}/exec",
	"POST /v1/sandboxes/{id}/session",
	"GET /v1/sandboxes/{id}/files",
	"PUT /v1/sandboxes/{id}/files",
	"GET /v1/sandboxes/{id}/files/stat",
	"GET /v1/sandboxes/{id}/files/list",
	"POST /v1/sandboxes/{id}/files/mkdir",
	"POST /v1/sandboxes/{id}/files/remove",
	"POST /v1/sandboxes/{id}/files/rename",
	"GET /v1/sandboxes/{id}/logs",
	"POST /v1/sandboxes/{id}/network",
}

// Proxy passes the channel's allowed calls to ctld's socket.
type Proxy struct {
	// Socket is ctld's API socket.
	Socket string
	Log    *slog.Logger
}

// Handler routes Routes to ctld and answers anything else not_found in
// ctld's error shape, without calling ctld.
func (p *Proxy) Handler() http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&url.URL{Scheme: "http", Host: "ctld"})
			pr.Out.Host = "ctld"
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", p.Socket)
			},
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     time.Minute,
		},
		// Streams (SSE exec, logs, session frames) pass as they come.
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(logging.OrDiscard(p.Log).Handler(), slog.LevelWarn),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			logging.OrDiscard(p.Log).Warn("node channel: ctld call failed", "method", r.Method, "path", r.URL.Path, "err", err)
			writeError(w, http.StatusServiceUnavailable, errdefs.CodeUnavailable, "ctld did not answer through the node channel: "+err.Error())
		},
	}
	mux := http.NewServeMux()
	for _, route := range Routes {
		mux.HandleFunc(route, func(w http.ResponseWriter, r *http.Request) {
			// A session's stdin keeps coming while its output is
			// written: both directions at once.
			_ = http.NewResponseController(w).EnableFullDuplex()
			rp.ServeHTTP(w, r)
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, errdefs.CodeNotFound, fmt.Sprintf("the node channel does not pass %s %s", r.Method, r.URL.EscapedPath()))
	})
	return mux
}

func writeError(w http.ResponseWriter, status int, code errdefs.Code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(api.ErrorBody{Code: code, Message: msg})
}

// Serve answers the channel on ln (TLS with conf) until ctx ends.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, conf *tls.Config, log *slog.Logger) error {
	hs := &http.Server{
		Handler:           h,
		TLSConfig:         conf,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(logging.OrDiscard(log).Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve node channel: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := hs.Shutdown(sctx)
	if err != nil {
		err = errors.Join(fmt.Errorf("shut down node channel: %w", err), hs.Close())
	}
	<-errc
	return err
}
