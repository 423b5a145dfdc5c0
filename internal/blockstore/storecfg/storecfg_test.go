package storecfg_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/s3store/s3test"
	"github.com/ctld/ctld/internal/blockstore/storecfg"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// An S3 store opens with credentials from the environment or a 0600 file,
// and what it stores reads back through a second Open of the same settings.
func TestOpenS3(t *testing.T) {
	srv := s3test.Start(t)
	ctx := context.Background()
	c := storecfg.Config{Location: "s3://" + srv.NewBucket(t) + "/node-1", Endpoint: srv.Endpoint}
	st, err := c.Open(ctx, true, env(map[string]string{storecfg.EnvAccessKey: srv.Access, storecfg.EnvSecretKey: srv.Secret}))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(t.TempDir(), "s3.env")
	if err := os.WriteFile(creds, []byte("# test\nAWS_ACCESS_KEY_ID="+srv.Access+"\nexport AWS_SECRET_ACCESS_KEY=\""+srv.Secret+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.CredentialsFile = creds
	st, err = c.Open(ctx, false, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := st.Get(ctx, "k"); err != nil || string(b) != "v" {
		t.Fatalf("Get = %q, %v", b, err)
	}
}

// Bad settings are refused at Open, each naming its cause.
func TestOpenRefusesBadSettings(t *testing.T) {
	srv := s3test.Start(t)
	bucket := srv.NewBucket(t)
	good := env(map[string]string{storecfg.EnvAccessKey: srv.Access, storecfg.EnvSecretKey: srv.Secret})
	wrong := env(map[string]string{storecfg.EnvAccessKey: srv.Access, storecfg.EnvSecretKey: "not-the-secret"})
	loose := filepath.Join(t.TempDir(), "s3.env")
	if err := os.WriteFile(loose, []byte("AWS_ACCESS_KEY_ID="+srv.Access+"\nAWS_SECRET_ACCESS_KEY="+srv.Secret+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	down := "http://" + s3test.FreePort(t)
	for _, tc := range []struct {
		name   string
		c      storecfg.Config
		getenv func(string) string
		want   string
	}{
		{"bad secret", storecfg.Config{Location: "s3://" + bucket, Endpoint: srv.Endpoint}, wrong, "access to bucket " + bucket + " denied (bad credentials"},
		{"no bucket", storecfg.Config{Location: "s3://nosuch-bucket", Endpoint: srv.Endpoint}, good, "bucket nosuch-bucket not found"},
		{"server down", storecfg.Config{Location: "s3://" + bucket, Endpoint: down}, good, "S3 endpoint unreachable"},
		{"no credentials", storecfg.Config{Location: "s3://" + bucket, Endpoint: srv.Endpoint}, env(nil), "no S3 credentials"},
		{"credentials file readable by others", storecfg.Config{Location: "s3://" + bucket, Endpoint: srv.Endpoint, CredentialsFile: loose}, good, "readable by group or others"},
		{"no bucket named", storecfg.Config{Location: "s3:///x", Endpoint: srv.Endpoint}, good, "names no bucket"},
		{"traversing prefix", storecfg.Config{Location: "s3://" + bucket + "/../x", Endpoint: srv.Endpoint}, good, "prefix"},
		{"bad endpoint", storecfg.Config{Location: "s3://" + bucket, Endpoint: "ftp://x"}, good, "not an http(s) URL"},
		{"relative dir", storecfg.Config{Location: "store"}, good, "neither an absolute directory"},
		{"S3 settings on a dir", storecfg.Config{Location: "/var/lib/x", Endpoint: srv.Endpoint}, good, "S3 settings given for the directory store"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.c.Open(context.Background(), false, tc.getenv)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open = %v, want an error with %q", err, tc.want)
			}
			if strings.Contains(err.Error(), srv.Secret) {
				t.Errorf("the error shows the secret: %v", err)
			}
		})
	}
	// A refusal stored nothing: the bucket is still empty.
	st, err := storecfg.Config{Location: "s3://" + bucket, Endpoint: srv.Endpoint}.Open(context.Background(), false, good)
	if err != nil {
		t.Fatal(err)
	}
	if keys, err := st.List(context.Background(), ""); err != nil || len(keys) != 0 {
		t.Errorf("bucket after refusals: %v, %v", keys, err)
	}
	var _ blockstore.Store = st
	if err := (storecfg.Config{Location: "rel"}).Check(); !errors.Is(err, storecfg.ErrInvalid) {
		t.Errorf("Check of a relative dir = %v, want ErrInvalid", err)
	}
}

// The writer's environment gets only the credentials' variables.
func TestEnv(t *testing.T) {
	got := storecfg.Env(env(map[string]string{storecfg.EnvAccessKey: "a", storecfg.EnvSecretKey: "s", "HOME": "/root"}))
	if strings.Join(got, " ") != "AWS_ACCESS_KEY_ID=a AWS_SECRET_ACCESS_KEY=s" {
		t.Errorf("Env = %v", got)
	}
}
