package fakekernel

import (
	"context"
	"errors"
	"github.com/ctld/ctld/internal/journal"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/lease"
	"github.com/ctld/ctld/internal/runsc"
)

const id = "sb-g1"

func newKernel(t *testing.T) *Kernel {
	t.Helper()
	k, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// guest makes everything of one generation, as a claim does, and returns
// the netns identity.
func guest(t *testing.T, k *Kernel) {
	t.Helper()
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(k.Runtime().ContainerLogDir(id), 0o700))
	must(k.Leases().Create(ctx, lease.Spec{ID: id, CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 64}))
	must(k.RootFS().LimitDisk(ctx, id, 7, 1<<20))
	root, err := k.RootFS().Mount(ctx, id, filepath.Join(k.TemplatesDir(), "busybox"))
	must(err)
	ns, err := k.Netns().Create(ctx, id)
	must(err)
	bundle := filepath.Join(k.RunDir(), "bundles", id)
	spec, err := runsc.BuildSpec(runsc.BundleSpec{ContainerID: id, RootPath: root, NetnsPath: ns, CgroupsPath: k.Leases().CgroupsPath(id), Args: []string{"/bin/sleep", "1"}})
	must(err)
	must(runsc.WriteBundle(bundle, spec))
	must(k.Runtime().Create(ctx, id, bundle))
	must(k.Runtime().Start(ctx, id))
}

// TestStringShowsEveryObject: the text lists every object of a generation,
// sorted, and a teardown in the node's order empties it.
func TestStringShowsEveryObject(t *testing.T) {
	k := newKernel(t)
	if got := k.String(); got != "" {
		t.Fatalf("new kernel: %q", got)
	}
	guest(t, k)
	want := strings.Join([]string{
		"bundle sb-g1",
		"cgroup sb-g1 populated",
		"disk project 7 of sb-g1 limit 1048576 bytes 1024 inodes, used 0 bytes 4 inodes", // the scratch and root dirs, the template's bin and tmp
		"logs sb-g1",
		"mount sb-g1 superblock 0:100 lower busybox",
		"netns sb-g1 net:[4026532101]",
		"runsc sb-g1 running",
		"scratch sb-g1",
	}, "\n")
	if got := k.String(); got != want {
		t.Fatalf("state:\n%s\nwant:\n%s", got, want)
	}
	ctx := context.Background()
	for _, err := range []error{
		k.Runtime().Kill(ctx, id, syscall.SIGKILL, true), k.Runtime().Delete(ctx, id),
		os.RemoveAll(filepath.Join(k.RunDir(), "bundles", id)),
		k.Netns().Delete(ctx, id), k.RootFS().Unmount(ctx, id), k.RootFS().UnlimitDisk(ctx, 7),
		k.Leases().Remove(ctx, id), os.RemoveAll(k.Runtime().ContainerLogDir(id)),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := k.String(); got != "" {
		t.Fatalf("after teardown:\n%s", got)
	}
}

// TestIdempotency: as the real subsystems, removing what is gone succeeds;
// making a lease or container twice is an error, a mount or netns twice
// is the same object.
func TestIdempotency(t *testing.T) {
	k := newKernel(t)
	ctx := context.Background()
	for name, err := range map[string]error{
		"lease remove":   k.Leases().Remove(ctx, id),
		"unmount":        k.RootFS().Unmount(ctx, id),
		"unlimit disk":   k.RootFS().UnlimitDisk(ctx, 7),
		"netns delete":   k.Netns().Delete(ctx, id),
		"runsc delete":   k.Runtime().Delete(ctx, id),
		"unlimit disk 0": k.RootFS().UnlimitDisk(ctx, 0),
		"remove scratch": k.RootFS().RemoveScratch(id),
	} {
		if err != nil {
			t.Errorf("%s of nothing: %v", name, err)
		}
	}
	if err := k.Runtime().Kill(ctx, id, syscall.SIGKILL, true); !errors.Is(err, runsc.ErrNotExist) {
		t.Errorf("kill of no container: %v, want ErrNotExist", err)
	}
	guest(t, k)
	if err := k.RootFS().RemoveScratch(id); err == nil {
		t.Error("RemoveScratch of a scratch dir with an overlay's dirs in it succeeded")
	}
	if err := k.Leases().Create(ctx, lease.Spec{ID: id, CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 64}); !errors.Is(err, fs.ErrExist) {
		t.Errorf("second lease create: %v, want fs.ErrExist", err)
	}
	if err := k.Runtime().Create(ctx, id, filepath.Join(k.RunDir(), "bundles", id)); err == nil {
		t.Error("second runsc create succeeded")
	}
	if _, err := k.RootFS().Mount(ctx, id, filepath.Join(k.TemplatesDir(), "busybox")); err != nil {
		t.Errorf("second mount over the same lower: %v", err)
	}
	other := filepath.Join(k.TemplatesDir(), "other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := k.RootFS().Mount(ctx, id, other); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Errorf("mount over another lower: %v, want conflict", err)
	}
	before := k.String()
	if _, err := k.Netns().Create(ctx, id); err != nil {
		t.Errorf("second netns create: %v", err)
	}
	if err := k.RootFS().LimitDisk(ctx, id, 7, 1<<20); err != nil {
		t.Errorf("second disk limit: %v", err)
	}
	if after := k.String(); after != before {
		t.Errorf("repeated makes changed the kernel:\n%s\nwas:\n%s", after, before)
	}
	if err := k.RootFS().LimitDisk(ctx, "sb-g2", 7, 1<<20); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Errorf("a project another dir uses: %v, want conflict", err)
	}
}

// TestGuestHoldsRootAndNetns: while the guest lives, unmounting its root
// and deleting its netns name leave the superblock and the namespace
// alive (the real unmount is lazy, a netns lives while a process is in
// it), and the proof's checks say so once the identities are known.
func TestGuestHoldsRootAndNetns(t *testing.T) {
	k := newKernel(t)
	ctx := context.Background()
	guest(t, k)
	dev, err := k.RootFS().Superblock(id)
	if err != nil {
		t.Fatal(err)
	}
	nsid, err := k.Netns().Identify(ctx, id)
	if err != nil || !nsid.Known() {
		t.Fatalf("identify: %+v %v", nsid, err)
	}
	if err := k.RootFS().Unmount(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := k.Netns().Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if ok, d := k.RootFS().CheckGone(ctx, id, dev); ok {
		t.Errorf("mount check passed while the guest holds the superblock: %s", d)
	}
	if ok, d := k.RootFS().CheckGone(ctx, id, ""); !ok {
		t.Errorf("without a recorded superblock the real check cannot see holders: %s", d)
	}
	if ok, d := k.Netns().CheckGone(ctx, id, nsid); ok {
		t.Errorf("netns check passed while the guest is in the namespace: %s", d)
	}
	s := k.String()
	for _, want := range []string{"superblock 0:100 of sb-g1 detached, held by runsc sb-g1", "namespace net:[4026532101] of sb-g1 unnamed, held by runsc sb-g1"} {
		if !strings.Contains(s, want) {
			t.Errorf("state lacks %q:\n%s", want, s)
		}
	}
	if err := k.Runtime().Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if ok, d := k.RootFS().CheckGone(ctx, id, dev); !ok {
		t.Errorf("mount check after the guest went: %s", d)
	}
	if ok, d := k.Netns().CheckGone(ctx, id, nsid); !ok {
		t.Errorf("netns check after the guest went: %s", d)
	}
}

// TestKillGuestAndRefuse: a killed guest empties its lease but keeps its
// runsc state; an object that refuses removal stays (and fails its check)
// until allowed; removing a lease kills what runs in it.
func TestKillGuestAndRefuse(t *testing.T) {
	k := newKernel(t)
	ctx := context.Background()
	guest(t, k)
	k.KillGuest(id)
	if pop, _ := k.Leases().Populated(ctx, id); pop {
		t.Error("lease populated after the guest was killed")
	}
	if known, _ := k.Runtime().Known(); len(known) != 1 {
		t.Errorf("runsc state gone with the guest's processes: %v", known)
	}
	if _, err := k.Runtime().Exec(ctx, id, runsc.ExecProcess{Args: []string{"/bin/true"}}, nil, nil, nil); err == nil {
		t.Error("exec in a killed guest succeeded")
	}
	k.Refuse(journal.KindRunsc, id, nil)
	if err := k.Runtime().Delete(ctx, id); err == nil {
		t.Error("refused delete succeeded")
	}
	if ok, _ := k.Runtime().CheckGone(ctx, id); ok {
		t.Error("refused container checks gone")
	}
	k.Allow(journal.KindRunsc, id)
	if err := k.Runtime().Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if ok, d := k.Runtime().CheckGone(ctx, id); !ok {
		t.Error(d)
	}

	k2 := newKernel(t)
	guest(t, k2)
	if err := k2.Leases().Remove(ctx, id); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(k2.String(), "runsc sb-g1 stopped") {
		t.Errorf("removing the lease did not kill the guest in it:\n%s", k2)
	}
}

// TestCreateNeedsItsObjects: runsc create fails, as the real one, without
// a bundle, a root or the netns its spec names.
func TestCreateNeedsItsObjects(t *testing.T) {
	k := newKernel(t)
	ctx := context.Background()
	if err := k.Runtime().Create(ctx, id, filepath.Join(k.RunDir(), "bundles", id)); err == nil {
		t.Error("create without a bundle succeeded")
	}
	bundle := filepath.Join(k.RunDir(), "bundles", id)
	spec := &specs.Spec{Root: &specs.Root{Path: filepath.Join(k.root, "nowhere")}, Linux: &specs.Linux{}}
	if err := runsc.WriteBundle(bundle, spec); err != nil {
		t.Fatal(err)
	}
	if err := k.Runtime().Create(ctx, id, bundle); err == nil {
		t.Error("create without a root succeeded")
	}
	spec.Root.Path = k.TemplatesDir()
	spec.Linux.Namespaces = []specs.LinuxNamespace{{Type: specs.NetworkNamespace, Path: k.Netns().Path(id)}}
	if err := runsc.WriteBundle(bundle, spec); err != nil {
		t.Fatal(err)
	}
	if err := k.Runtime().Create(ctx, id, bundle); err == nil {
		t.Error("create without its netns succeeded")
	}
}
