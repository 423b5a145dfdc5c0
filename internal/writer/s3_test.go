package writer_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/s3store/s3test"
	"github.com/ctld/ctld/internal/blockstore/storecfg"
	"github.com/ctld/ctld/internal/cowdev"
	"github.com/ctld/ctld/internal/writer"
)

// TestOpenRepoS3: a writer whose spec names an S3 store (versitygw) reads a
// template's chunk through it, with the credentials from its file or from
// its environment; the spec itself holds no secret; a wrong secret is a
// refusal naming the cause.
func TestOpenRepoS3(t *testing.T) {
	srv := s3test.Start(t)
	ctx := context.Background()
	root := t.TempDir()
	nk, raw, err := blockstore.GenerateNodeKey("node-a")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(root, "node.key")
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(raw)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	st := srv.NewStore(t, "store")
	repo, err := blockstore.New(st, nk, blockstore.Options{Compression: blockstore.CompressS2})
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, blockstore.DefaultChunkSize)
	rand.Read(chunk)
	base := blockstore.GenRef{Volume: blockstore.Template("t")}
	if _, err := repo.Commit(ctx, blockstore.CommitSpec{Generation: base, DeviceSize: 4 * blockstore.DefaultChunkSize}, map[uint64][]byte{2: chunk}); err != nil {
		t.Fatal(err)
	}
	bucket := st.Bucket()
	creds := filepath.Join(root, "s3.env")
	if err := os.WriteFile(creds, []byte("AWS_ACCESS_KEY_ID="+srv.Access+"\nAWS_SECRET_ACCESS_KEY="+srv.Secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := writer.Spec{Sandbox: "sb-1", Generation: 1, Epoch: 1, NodeKeyFile: keyFile, NodeKeyID: "node-a", Base: base, Index: -1,
		Store: storecfg.Config{Location: "s3://" + bucket + "/store", Endpoint: srv.Endpoint}}
	noEnv := func(string) string { return "" }
	withEnv := func(secret string) func(string) string {
		return func(k string) string {
			return map[string]string{storecfg.EnvAccessKey: srv.Access, storecfg.EnvSecretKey: secret}[k]
		}
	}
	for _, tc := range []struct {
		name   string
		file   string
		getenv func(string) string
	}{{"credentials file", creds, noEnv}, {"environment", "", withEnv(srv.Secret)}} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec
			s.Store.CredentialsFile = tc.file
			s.Dir = filepath.Join(t.TempDir(), "w")
			if err := s.Check(); err != nil {
				t.Fatal(err)
			}
			key, err := writer.LoadNodeKey(s.NodeKeyFile, s.NodeKeyID)
			if err != nil {
				t.Fatal(err)
			}
			r, local, err := writer.OpenRepo(ctx, s, key, tc.getenv)
			if err != nil {
				t.Fatal(err)
			}
			if local {
				t.Error("an S3 store taken for a local one")
			}
			dev, err := cowdev.Open(ctx, cowdev.Config{Repo: r, Base: s.Base, Dir: s.Dir})
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			got := make([]byte, 2*blockstore.DefaultChunkSize)
			if _, err := dev.ReadAt(got, blockstore.DefaultChunkSize); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[:blockstore.DefaultChunkSize], make([]byte, blockstore.DefaultChunkSize)) || !bytes.Equal(got[blockstore.DefaultChunkSize:], chunk) {
				t.Error("chunks 1-2 read through the S3 store differ from the template's (hole, data)")
			}
		})
	}
	key, _ := writer.LoadNodeKey(keyFile, "node-a")
	if _, _, err := writer.OpenRepo(ctx, spec, key, withEnv("wrong")); err == nil || !strings.Contains(err.Error(), "bad credentials") {
		t.Errorf("OpenRepo with a wrong secret = %v, want a bad-credentials refusal", err)
	}
	bad := spec
	bad.Dir = "/w/sb"
	bad.Store.Location = "s3://"
	if err := bad.Check(); !errors.Is(err, writer.ErrInvalidSpec) {
		t.Errorf("Check of a spec with a store naming no bucket = %v, want ErrInvalidSpec", err)
	}
}
