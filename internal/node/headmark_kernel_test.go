package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/blockvol"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/rootfs"
	"github.com/ctld/ctld/internal/writer"
)

// TestKernelResumeRefusesRolledBackHead (issue 21): on the real kernel
// (runsc guests on block roots, `ctld writer` processes, a directory
// block store that the test tampers with as a hostile bucket would), a
// sandbox paused twice (head 2 holds "two", head 1 "one"): with head 2's
// object deleted, and then with only a saved copy of head 1 put back,
// the resume is refused as a conflict, also after a failover, and starts
// nothing; with head 2 back the resume runs and reads "two": nothing
// lost.
func TestKernelResumeRefusesRolledBackHead(t *testing.T) {
	ktest.Require(t)
	store := newRealBlockStore(t)
	k := realBlockKernel(t, store)
	k.noReuse = true
	k.volumes = blockvol.Volumes{Repo: store.templates.repo}
	k.sealer = blockvol.Sealer{Supervisor: k.block.(*writer.Supervisor)}
	k.freezer = k.blockMounts.(*rootfs.Block)
	const id = "rb"
	r := newRig(t, k)
	r.mustBoot()
	ctx, cancel := r.ctx()
	defer cancel()
	for _, s := range []struct {
		gen  uint64
		text string
	}{{1, "one\n"}, {2, "two\n"}} {
		r.mustClaim(id, claimReq(fmt.Sprintf("c%d", s.gen), s.gen))
		if err := r.n.WriteFile(ctx, id, "/kept", []byte(s.text)); err != nil {
			t.Fatalf("write /kept: %v", err)
		}
		if h := r.mustPause(id, fmt.Sprintf("p%d", s.gen)).Head; h.Seq != s.gen {
			t.Fatalf("pause %d published head %+v", s.gen, h)
		}
	}
	heads := filepath.Join(store.cfg.StoreDir, "sandboxes", id, "head")
	head := func(seq int) string { return filepath.Join(heads, fmt.Sprintf("%020d", seq)) }
	saved1, err := os.ReadFile(head(1))
	if err != nil {
		t.Fatal(err)
	}
	saved2, err := os.ReadFile(head(2))
	if err != nil {
		t.Fatal(err)
	}
	refused := func(op string) {
		t.Helper()
		_, err, returned := r.claim(id, claimReq(op, 3))
		if !returned || errdefs.CodeOf(err) != errdefs.CodeConflict || !strings.Contains(err.Error(), "rolled back") {
			t.Fatalf("resume %s over a rolled-back bucket: %v, want conflict", op, err)
		}
		t.Logf("resume %s refused: %v", op, err)
		r.checkClean("after the refused resume " + op)
	}
	if err := os.Remove(head(2)); err != nil {
		t.Fatal(err)
	}
	refused("c3")
	r.mustBoot() // failover: the mark is the journal's
	refused("c3b")
	if err := os.Remove(head(1)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(head(1), saved1, 0o644); err != nil { // the saved older head put back
		t.Fatal(err)
	}
	refused("c3c")

	if err := os.WriteFile(head(2), saved2, 0o644); err != nil {
		t.Fatal(err)
	}
	r.mustClaim(id, claimReq("c4", 3))
	got, err := r.n.ReadFile(ctx, id, "/kept", 1<<20)
	if err != nil || string(got) != "two\n" {
		t.Fatalf("/kept after the resume: %q, %v; want the last pause's", got, err)
	}
	r.mustRelease(id, "r4", 3)
	r.checkClean("at the end")
}
