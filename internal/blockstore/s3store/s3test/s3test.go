// Package s3test starts the real S3 server the S3 backend is tested
// against (versitygw, installed by test/s3/setup.sh) for a test.
package s3test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ctld/ctld/internal/blockstore/s3store"
)

// Server is a versitygw S3 server the test started on loopback over a
// temp directory; it is stopped when the test ends.
type Server struct {
	Endpoint string
	Access   string
	Secret   string
	buckets  atomic.Int64
}

// Bin finds the server test/s3/setup.sh installs. Missing is a failure,
// not a skip: a backend that was not exercised is not proven.
func Bin(t testing.TB) string {
	t.Helper()
	p := os.Getenv("CTLD_VERSITYGW")
	if p == "" {
		cache := os.Getenv("CTLD_S3_CACHE")
		if cache == "" {
			cache = "/var/cache/ctld-s3"
		}
		p = filepath.Join(cache, "versitygw-v1.8.0")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("S3 test server versitygw not installed (%v): run test/s3/setup.sh (make test-unit does)", err)
	}
	return p
}

// FreePort is a loopback address nothing listens on (just now).
func FreePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Start starts versitygw's posix backend with a sidecar metadata dir
// (no xattrs needed: the test VM's TMPDIR is a tmpfs without user xattrs).
func Start(t testing.TB) *Server {
	t.Helper()
	bin := Bin(t)
	dir := t.TempDir()
	for _, d := range []string{"data", "meta"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	s := &Server{Access: "ctldtest", Secret: "ctldtestsecret"}
	var lastErr error
	// The port is picked free and then handed over: retry if another
	// process took it in between.
	for attempt := 0; attempt < 3; attempt++ {
		addr := FreePort(t)
		logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("versitygw-%d.log", attempt)))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "--access", s.Access, "--secret", s.Secret, "--port", addr,
			"posix", "--sidecar", filepath.Join(dir, "meta"), filepath.Join(dir, "data"))
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatalf("start versitygw: %v", err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait(); logf.Close() }()
		s.Endpoint = "http://" + addr
		if lastErr = waitReady(s, exited, 60*time.Second); lastErr == nil {
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-exited
			})
			return s
		}
		_ = cmd.Process.Kill()
		<-exited
		log, _ := os.ReadFile(logf.Name())
		lastErr = fmt.Errorf("%w; log:\n%s", lastErr, log)
	}
	t.Fatalf("versitygw did not come up: %v", lastErr)
	return nil
}

func waitReady(s *Server, exited <-chan error, limit time.Duration) error {
	st, err := s3store.New(s3store.Config{Endpoint: s.Endpoint, Bucket: "probe", AccessKey: s.Access, SecretKey: s.Secret})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := st.Client().ListBuckets(ctx, &s3.ListBucketsInput{})
		cancel()
		if err == nil {
			return nil
		}
		select {
		case werr := <-exited:
			return fmt.Errorf("versitygw exited: %v (last probe: %v)", werr, err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not answering after %s: %v", limit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// NewBucket makes a fresh, empty bucket and returns its name.
func (s *Server) NewBucket(t testing.TB) string {
	t.Helper()
	bucket := fmt.Sprintf("ctld-test-%d", s.buckets.Add(1))
	st, err := s3store.New(s3store.Config{Endpoint: s.Endpoint, Bucket: bucket, AccessKey: s.Access, SecretKey: s.Secret})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Client().CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatalf("create bucket %s: %v", bucket, err)
	}
	return bucket
}

// NewStore makes a fresh bucket and a store over it.
func (s *Server) NewStore(t testing.TB, prefix string) *s3store.Store {
	t.Helper()
	st, err := s3store.New(s3store.Config{Endpoint: s.Endpoint, Bucket: s.NewBucket(t), Prefix: prefix, AccessKey: s.Access, SecretKey: s.Secret})
	if err != nil {
		t.Fatal(err)
	}
	return st
}
