package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The block store commands take the store's settings from ctld's file
// (its other keys ignored): the file's block-store and node-key, or both
// under its state-dir as ctld places them; a flag still wins; a bad value
// names the file, line and key.
func TestCLIStoreSettingsFromConfig(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	cfg := func(name, src string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }

	named := cfg("named.toml", "max-concurrent-claims = 3\nblock-store = \""+dir+"/store\"\nnode-key = \""+dir+"/node.key\"\n")
	if r := e.run("", "volume", "create", "data", "--size", "8Mi", "--config", named); r.code != 0 {
		t.Fatalf("create: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if !exists(dir+"/node.key") || !exists(dir+"/store") {
		t.Fatal("the file's node key and store were not used")
	}
	if r := e.run("", "volume", "ls", "--config", named); r.code != 0 || !strings.Contains(r.stdout, "data") {
		t.Fatalf("ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The command line wins over the file.
	if r := e.run("", "volume", "ls", "--config", named, "--store", dir+"/other"); r.code == 0 || strings.Contains(r.stdout, "data") {
		t.Fatalf("ls --store other: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	under := cfg("state.toml", "state-dir = \""+dir+"/sd\"\n")
	if r := e.run("", "volume", "create", "data", "--size", "8Mi", "--config", under); r.code != 0 {
		t.Fatalf("create under state-dir: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if !exists(dir+"/sd/blockstore.key") || !exists(dir+"/sd/blockstore") {
		t.Fatal("the store and key were not placed under the file's state-dir")
	}

	bad := cfg("bad.toml", "block-store = \""+dir+"/store\"\n\ns3-virtual-hosted = \"yes\"\n")
	for _, g := range [][]string{{"template", "ls"}, {"volume", "ls"}, {"store", "gc"}} {
		if r := e.run("", append(g, "--config", bad)...); r.code != exitUsage || !strings.Contains(r.stderr, "bad.toml:3: key \"s3-virtual-hosted\": want true or false") {
			t.Errorf("%s ls with a bad file: exit %d\n%s", g, r.code, r.stderr)
		}
	}
	if r := e.run("", "volume", "ls", "--config", dir+"/none.toml"); r.code != exitUsage || !strings.Contains(r.stderr, "none.toml") {
		t.Errorf("missing --config file: exit %d\n%s", r.code, r.stderr)
	}
}
