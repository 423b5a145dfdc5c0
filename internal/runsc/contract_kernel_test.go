package runsc_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/node/guest/runtimetest"
	"github.com/ctld/ctld/internal/runsc"
	"github.com/ctld/ctld/internal/template"
)

// TestKernelRuntimeContract: *runsc.Runtime with real gVisor guests (a
// busybox root, a netns and a pre-made lease cgroup each, as ctld's
// bundles) keeps the runtime contract the fake kernel keeps on the host
// (node/fakekernel TestRuntimeContract); each case on a runsc root of its
// own, leak-checked.
func TestKernelRuntimeContract(t *testing.T) {
	ktest.Require(t)
	ktest.RequireBinary(t, "runsc")
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	version, err := runsc.Version(context.Background(), "runsc")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("runsc %s", version)
	n := 0
	runtimetest.Run(t, func(t *testing.T) runtimetest.Subject {
		tmp := t.TempDir()
		root := filepath.Join(tmp, "runsc")
		ktest.CheckLeaks(t, ktest.SnapshotOptions{RunscRoots: []string{root}})
		r := &runsc.Runtime{Root: root, LogDir: filepath.Join(tmp, "logs"), Version: version, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
		return runtimetest.Subject{Runtime: r, Bundle: func(t *testing.T, id string) string {
			n++
			dir := t.TempDir()
			rootfs := filepath.Join(dir, "rootfs")
			if err := template.BuildBusybox(rootfs, "/bin/busybox"); err != nil {
				t.Fatal(err)
			}
			cgroup := fmt.Sprintf("ctld-rtc-%d-%d", os.Getpid(), n)
			lease := ktest.MakeCgroup(t, cgroup)
			for f, v := range map[string]string{"cpu.max": "100000 100000", "memory.max": "268435456", "memory.swap.max": "0", "pids.max": "128"} {
				if err := os.WriteFile(filepath.Join(lease, f), []byte(v), 0o644); err != nil {
					t.Fatalf("write %s: %v", f, err)
				}
			}
			s, err := runsc.BuildSpec(runsc.BundleSpec{
				ContainerID: id, RootPath: rootfs, Hostname: id,
				NetnsPath: ktest.NewNetns(t).Path, CgroupsPath: "/" + cgroup,
				CPUMillis: 1000, MemoryBytes: 256 << 20, PIDs: 128,
				Args: []string{"sleep", "1000"},
			})
			if err != nil {
				t.Fatal(err)
			}
			bundle := filepath.Join(dir, "bundle")
			if err := runsc.WriteBundle(bundle, s); err != nil {
				t.Fatal(err)
			}
			return bundle
		}}
	})
}
