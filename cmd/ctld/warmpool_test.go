package main

import (
	"reflect"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/ctld/ctld/internal/node"
	"github.com/ctld/ctld/internal/node/warm"
)

// The pool's flags (and so their ctld.toml keys) reach the node's
// warm.Settings; unset, they are the documented defaults.
func TestWarmPoolFlags(t *testing.T) {
	parse := func(args ...string) warmOpts {
		t.Helper()
		var o warmOpts
		f := pflag.NewFlagSet("run", pflag.ContinueOnError)
		warmFlags(f, &o)
		if err := f.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := o.check(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return o
	}
	got := parse("--warm-pool", "busybox=2,other=1", "--warm-pool", "third=0", "--warm-pool-budget", "2",
		"--warm-pool-max-age", "5m", "--warm-pool-refill-every", "250ms").settings()
	want := warm.Settings{Sizes: map[string]int{"busybox": 2, "other": 1, "third": 0}, Budget: 2, MaxAge: 5 * time.Minute, RefillEvery: 250 * time.Millisecond}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("settings %+v, want %+v", got, want)
	}
	got = parse().settings()
	want = warm.Settings{MaxAge: warm.DefaultMaxAge, RefillEvery: node.DefaultWarmRefill}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("default settings %+v, want %+v", got, want)
	}
}
