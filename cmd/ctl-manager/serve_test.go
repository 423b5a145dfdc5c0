package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
)

// TestCLIServe: keys and quotas from the CLI, then `serve` on a real
// socket over the fake node, used with the Go client.
func TestCLIServe(t *testing.T) {
	e := newEnv(t)
	key := strings.TrimSpace(e.ok("key", "create", "--owner", "team-a"))
	if !strings.HasPrefix(key, "ctl_") {
		t.Fatalf("key create printed %q", key)
	}
	if out := e.ok("owner", "quota", "set", "team-a", "--sandboxes", "1", "--cpu", "2", "--memory", "1Gi", "--disk", "10Gi", "--creates-per-min", "30"); !strings.Contains(out, "sandboxes 0/1, cpu 0/2, memory 0/1Gi") {
		t.Fatalf("quota set printed %q", out)
	}
	if r := e.run("", "owner", "quota", "set", "team-a", "--cpu", "lots"); r.code != exitUsage {
		t.Fatalf("bad --cpu: exit %d %s", r.code, r.stderr)
	}
	ls := e.ok("key", "ls")
	if !strings.Contains(ls, key[4:16]) || strings.Contains(ls, key) {
		t.Fatalf("key ls = %q: want the id, never the key", ls)
	}
	if r := e.run("", "key", "create"); r.code != exitUsage {
		t.Fatalf("key create without --owner: exit %d", r.code)
	}
	if r := e.run("", "serve", "--listen", "0.0.0.0:0"); r.code != exitUsage || !strings.Contains(r.stderr, "loopback") {
		t.Fatalf("plain HTTP off loopback: exit %d %s", r.code, r.stderr)
	}
	if r := e.run("", "serve", "--log-format", "xml"); r.code != exitUsage || !strings.Contains(r.stderr, "--log-format: ") {
		t.Fatalf("serve --log-format xml: exit %d %s", r.code, r.stderr)
	}
	if r := e.run("", "serve", "--log-level", "loud"); r.code != exitUsage || !strings.Contains(r.stderr, "--log-level: ") {
		t.Fatalf("serve --log-level loud: exit %d %s", r.code, r.stderr)
	}

	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	var errb strings.Builder
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--socket", e.socket, "--db", e.db, "serve", "--listen", "127.0.0.1:0", "--template", "busybox", "--template", "debian:block"}, strings.NewReader(""), pw, &errb, func(string) string { return "" })
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("serve printed nothing: %v", err)
	}
	go io.Copy(io.Discard, pr)
	base := strings.TrimSpace(strings.TrimPrefix(line, "serving on "))
	c := &client.Client{BaseURL: base, Key: key}
	tpls, err := c.Templates(ctx)
	if err != nil || len(tpls) != 2 || tpls[1].Name != "debian" || tpls[1].Mode != "block" || tpls[1].Languages != nil {
		t.Fatalf("templates = %+v, %v", tpls, err)
	}
	sb, err := c.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil || sb.State != client.StateReady || sb.EndsAt == nil {
		t.Fatalf("create = %+v, %v (want ready with the default timeout)", sb, err)
	}
	if _, err := c.Create(ctx, client.CreateRequest{Template: "busybox"}); err == nil || !strings.Contains(err.Error(), "quota_exceeded") {
		t.Fatalf("second create over a quota of 1: %v", err)
	}
	if d, err := c.Destroy(ctx, sb.ID); err != nil || !d.Proof.Verified {
		t.Fatalf("destroy = %+v, %v", d, err)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("serve exited %d: %s", code, errb.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop")
	}
	if strings.Contains(errb.String(), key) {
		t.Fatal("the key is in serve's log")
	}
	e.ok("key", "revoke", "--", key[4:16]) // an id may begin with "-"
	if out := e.ok("--json", "key", "ls", "--owner", "team-a"); !strings.Contains(out, `"revoked_at"`) {
		t.Fatalf("after revoke: %q", out)
	}
}

// startServe runs `serve` with args and returns its base URL and a stop
// function that waits for its exit code.
func (e *env) startServe(args ...string) (string, func() int) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"--socket", e.socket, "--db", e.db, "serve"}, args...), strings.NewReader(""), pw, io.Discard, func(string) string { return "" })
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		e.t.Fatalf("serve printed nothing: %v", err)
	}
	go io.Copy(io.Discard, pr)
	return strings.TrimSpace(strings.TrimPrefix(line, "serving on ")), func() int { cancel(); return <-done }
}

func TestCLIServeTLS(t *testing.T) {
	e := newEnv(t)
	key := strings.TrimSpace(e.ok("key", "create", "--owner", "team-a"))
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(priv)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	base, stop := e.startServe("--listen", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile)
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("serve with a certificate serves %s", base)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	c := &client.Client{BaseURL: base, Key: key, HTTP: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}}
	if _, err := c.Templates(context.Background()); err != nil {
		t.Fatalf("templates over TLS: %v", err)
	}
	plain := &client.Client{BaseURL: "http://" + strings.TrimPrefix(base, "https://"), Key: key}
	if _, err := plain.Templates(context.Background()); err == nil {
		t.Fatal("plain HTTP answered on the TLS port")
	}
	if code := stop(); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
}

// TestCLIServeVolumesFromConfig: serve takes the block store of its
// volumes from ctld's configuration file: a volume created through the
// API is in that store (`volume ls` with the same file lists it) and gone
// from it once deleted. Without a store that opens, the volume calls
// answer unavailable and the rest of the API serves.
func TestCLIServeVolumesFromConfig(t *testing.T) {
	e := newEnv(t)
	key := strings.TrimSpace(e.ok("key", "create", "--owner", "team-a"))
	dir := t.TempDir()
	cfg := filepath.Join(dir, "ctld.toml")
	if err := os.WriteFile(cfg, []byte("max-concurrent-claims = 3\nblock-store = \""+dir+"/store\"\nnode-key = \""+dir+"/node.key\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// ctld makes the key and the store; here `volume ls` stands in.
	e.ok("volume", "create", "seed", "--size", "1Mi", "--config", cfg)
	ctx := context.Background()

	base, stop := e.startServe("--listen", "127.0.0.1:0", "--config", cfg, "--volume-tmp-dir", t.TempDir())
	c := &client.Client{BaseURL: base, Key: key}
	v, err := c.CreateVolume(ctx, client.VolumeCreateRequest{Size: "2Mi"})
	if err != nil || v.State != client.VolumeReady {
		t.Fatalf("create volume: %+v, %v", v, err)
	}
	if ls := e.ok("volume", "ls", "--config", cfg); !strings.Contains(ls, v.ID) {
		t.Fatalf("volume ls with the same file:\n%s\nwant %s", ls, v.ID)
	}
	if d, err := c.DeleteVolume(ctx, v.ID); err != nil || d.State != client.VolumeDeleted {
		t.Fatalf("delete volume: %+v, %v", d, err)
	}
	if ls := e.ok("volume", "ls", "--config", cfg); strings.Contains(ls, v.ID) {
		t.Fatalf("volume ls after the delete still lists %s:\n%s", v.ID, ls)
	}
	if code := stop(); code != 0 {
		t.Fatalf("serve exited %d", code)
	}

	empty := filepath.Join(dir, "empty.toml")
	if err := os.WriteFile(empty, []byte("block-store = \""+dir+"/none\"\nnode-key = \""+dir+"/none.key\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base, stop = e.startServe("--listen", "127.0.0.1:0", "--config", empty)
	c = &client.Client{BaseURL: base, Key: key}
	if _, err := c.CreateVolume(ctx, client.VolumeCreateRequest{Size: "2Mi"}); err == nil || !strings.Contains(err.Error(), "unavailable") {
		t.Fatalf("create volume without a block store: %v", err)
	}
	if _, err := c.Templates(ctx); err != nil {
		t.Fatalf("templates without a block store: %v", err)
	}
	if code := stop(); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
}
