package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/basecache"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/s3store/s3test"
	"github.com/ctld/ctld/internal/blockstore/storecfg"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/template"
	"github.com/ctld/ctld/internal/writer"
)

// TestBusyboxImportedOnce: buildBlock imports the busybox template dir
// into the block store as template "busybox" (its device size the
// flag's), and a second start finds it and imports nothing, and prunes
// the base cache of a template the store no longer has.
func TestBusyboxImportedOnce(t *testing.T) {
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("no /bin/busybox on this machine")
	}
	state := t.TempDir()
	bb := filepath.Join(state, "templates", "busybox")
	if err := template.BuildBusybox(bb, "/bin/busybox"); err != nil {
		t.Fatal(err)
	}
	o := blockOpts{keyID: "node", deadConn: time.Minute, cgroup: "w.slice", busyboxBytes: 64 << 20}
	ctx := context.Background()
	t0 := time.Now()
	_, d, err := buildBlock(ctx, state, t.TempDir(), bb, o, logging.OrDiscard(nil))
	if err != nil {
		t.Fatal(err)
	}
	first := time.Since(t0)
	if _, size, err := d.Block.Templates.Template(ctx, "busybox"); err != nil || size != 64<<20 {
		t.Fatalf("busybox template: size %d, %v", size, err)
	}
	if _, _, err := d.Block.Templates.Template(ctx, "nosuch"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Errorf("unknown template: %v, want not_found", err)
	}
	// The base cache of a template the store has is kept by the next
	// start, that of one it has not (removed since) is pruned.
	bc, err := basecache.Open(filepath.Join(state, "basecache"), basecache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	kept, gone := blockstore.GenRef{Volume: blockstore.Template("busybox")}, blockstore.GenRef{Volume: blockstore.Template("removed")}
	for _, r := range []blockstore.GenRef{kept, gone} {
		g, err := bc.Generation(r, blockstore.DefaultChunkSize, 4)
		if err != nil {
			t.Fatal(err)
		}
		g.Put(0, make([]byte, blockstore.DefaultChunkSize))
		_ = g.Close()
	}
	t0 = time.Now()
	if _, _, err := buildBlock(ctx, state, t.TempDir(), bb, o, logging.OrDiscard(nil)); err != nil {
		t.Fatal(err)
	}
	t.Logf("first start (import) %v, second start %v", first, time.Since(t0))
	tdir := filepath.Join(bc.Dir(), string(blockstore.KindTemplate))
	if _, err := os.Stat(filepath.Join(tdir, "removed")); !os.IsNotExist(err) {
		t.Errorf("base cache of a removed template: %v, want pruned", err)
	}
	if _, err := os.Stat(filepath.Join(tdir, "busybox")); err != nil {
		t.Errorf("base cache of busybox: %v, want kept", err)
	}
}

// TestBlockOptsCheck: the writers' timeouts are whole seconds, the
// dead-connection timeout long enough for a dead writer's restart.
func TestBlockOptsCheck(t *testing.T) {
	ok := blockOpts{deadConn: 2 * time.Minute, reqTimeout: 2 * time.Minute, cgroup: "ctld-writers.slice", busyboxBytes: 64 << 20}
	if err := ok.check(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	// The base cache: under the state dir by default, "off" for none.
	for in, want := range map[string]string{"": "/s/basecache", "off": "", "/c": "/c"} {
		o := ok
		o.baseCache = in
		if err := o.check(); err != nil {
			t.Errorf("--block-base-cache %q: %v", in, err)
		}
		if got := o.withDefaults("/s").baseCache; got != want {
			t.Errorf("--block-base-cache %q: %q, want %q", in, got, want)
		}
	}
	for name, mut := range map[string]func(*blockOpts){
		"dead conn too short":     func(o *blockOpts) { o.deadConn = 5 * time.Second },
		"dead conn not whole":     func(o *blockOpts) { o.deadConn = 10500 * time.Millisecond },
		"request timeout zero":    func(o *blockOpts) { o.reqTimeout = 0 },
		"request timeout partial": func(o *blockOpts) { o.reqTimeout = 1500 * time.Millisecond },
		"cgroup outside the root": func(o *blockOpts) { o.cgroup = "../w" },
		"relative base cache":     func(o *blockOpts) { o.baseCache = "cache" },
	} {
		o := ok
		mut(&o)
		if err := o.check(); err == nil {
			t.Errorf("%s: accepted %+v", name, o)
		}
	}
}

// TestBuildBlockS3: ctld opens an s3:// block store at start; a wrong
// secret, a missing bucket or a dead endpoint stop it naming the cause.
// With good settings the writers get the credentials in their environment
// only: the store settings they are handed carry no secret.
func TestBuildBlockS3(t *testing.T) {
	srv := s3test.Start(t)
	bucket := srv.NewBucket(t)
	state := t.TempDir()
	env := func(secret string) func(string) string {
		return func(k string) string {
			return map[string]string{storecfg.EnvAccessKey: srv.Access, storecfg.EnvSecretKey: secret}[k]
		}
	}
	o := blockOpts{keyID: "node", deadConn: time.Minute, cgroup: "w.slice", busyboxBytes: 64 << 20,
		store: "s3://" + bucket + "/node-1", s3: storecfg.Config{Endpoint: srv.Endpoint}, getenv: env(srv.Secret)}
	ctx := context.Background()
	for name, tc := range map[string]struct {
		mut  func(*blockOpts)
		want string
	}{
		"wrong secret":  {func(o *blockOpts) { o.getenv = env("wrong") }, "denied (bad credentials"},
		"no bucket":     {func(o *blockOpts) { o.store = "s3://nosuch/node-1" }, "bucket nosuch not found"},
		"dead endpoint": {func(o *blockOpts) { o.s3.Endpoint = "http://" + s3test.FreePort(t) }, "S3 endpoint unreachable"},
	} {
		bad := o
		tc.mut(&bad)
		if _, _, err := buildBlock(ctx, state, t.TempDir(), "", bad, logging.OrDiscard(nil)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: buildBlock = %v, want an error with %q", name, err, tc.want)
		}
	}
	cfg, d, err := buildBlock(ctx, state, t.TempDir(), "", o, logging.OrDiscard(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Store.Location != o.store || cfg.Store.Endpoint != srv.Endpoint {
		t.Errorf("writers' store settings %+v", cfg.Store)
	}
	if b, _ := json.Marshal(cfg.Store); strings.Contains(string(b), srv.Secret) {
		t.Errorf("writers' store settings hold the secret: %s", b)
	}
	sup := d.Writers.Devices.(*writer.Supervisor)
	if strings.Join(sup.Env, " ") != "AWS_ACCESS_KEY_ID="+srv.Access+" AWS_SECRET_ACCESS_KEY="+srv.Secret {
		t.Errorf("writers' environment %v", sup.Env)
	}
}

// TestProbeStore: a bad S3 store stops ctld before it waits for the lock;
// a directory store is not touched there.
func TestProbeStore(t *testing.T) {
	srv := s3test.Start(t)
	o := blockOpts{store: "s3://" + srv.NewBucket(t), s3: storecfg.Config{Endpoint: srv.Endpoint},
		getenv: func(k string) string {
			return map[string]string{storecfg.EnvAccessKey: srv.Access, storecfg.EnvSecretKey: "wrong"}[k]
		}}
	if err := o.probeStore(context.Background(), t.TempDir()); err == nil || !strings.Contains(err.Error(), "bad credentials") {
		t.Errorf("probeStore with a wrong secret = %v", err)
	}
	state := t.TempDir()
	if err := (blockOpts{}).probeStore(context.Background(), state); err != nil {
		t.Errorf("probeStore of the default dir store = %v", err)
	}
	if _, err := os.Stat(filepath.Join(state, "blockstore")); !os.IsNotExist(err) {
		t.Errorf("probeStore made the dir store: %v", err)
	}
}
