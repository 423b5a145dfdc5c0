// Package channeltest makes a cluster CA and certificates for tests of
// the node channel (the operator makes real ones: docs/operations.md).
package channeltest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/nodechannel"
)

// CA is a test cluster CA.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
	pem  string
}

// NewCA makes a CA whose files live in a temp dir of t.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &CA{cert: cert, key: key, dir: t.TempDir()}
	ca.pem = write(t, ca.dir, "ca.pem", "CERTIFICATE", der)
	return ca
}

var serial int64 = 100

// Issue makes a certificate of the CA: a node's (server, DNS SAN name)
// or a manager's (client, URI SAN nodechannel.ManagerURI), and returns
// its files with the CA's.
func (ca *CA) Issue(t testing.TB, name string, server bool) nodechannel.Files {
	t.Helper()
	if server {
		return ca.issue(t, name, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []string{name}, nil)
	}
	return ca.issue(t, name, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, []string{nodechannel.ManagerURI})
}

// IssueNodeWithClientAuth makes a node's certificate (DNS SAN name) that
// the CA also let authenticate clients: a hostile peer of the channel.
func (ca *CA) IssueNodeWithClientAuth(t testing.TB, name string) nodechannel.Files {
	t.Helper()
	return ca.issue(t, name, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, []string{name}, nil)
}

func (ca *CA) issue(t testing.TB, name string, usage []x509.ExtKeyUsage, dns, uris []string) nodechannel.Files {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage, DNSNames: dns,
	}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return nodechannel.Files{
		CA:   ca.pem,
		Cert: write(t, ca.dir, name+".pem", "CERTIFICATE", der),
		Key:  write(t, ca.dir, name+".key", "PRIVATE KEY", kb),
	}
}

func write(t testing.TB, dir, name, kind string, der []byte) string {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
