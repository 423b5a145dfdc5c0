package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/guestlog"
)

// A readiness failure quotes what the guest's sandbox or gofer wrote to
// its panic log (runsc --panic-log): a Go fatal error's first lines, not
// the goroutine dump after them.
func TestBootStateQuotesPanicLog(t *testing.T) {
	tk, _ := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, claimReq("op1", 1))
	rec := r.sandbox(sb)
	if s := r.n.guest.BootState(t.Context(), rec); strings.Contains(s, "panic") {
		t.Fatalf("boot state without a panic log: %s", s)
	}
	crash := "runtime: failed to create new OS thread (have 23 already; errno=11)\n" +
		"runtime: may need to increase max user processes (ulimit -u)\n" +
		"fatal error: newosproc\n\nruntime stack:\n" + strings.Repeat("goroutine 1 [running]:\nmain.main()\n", 5000)
	p := filepath.Join(r.n.d.Guest.Runtime.ContainerLogDir(rec.ContainerID), guestlog.PanicName)
	if err := os.WriteFile(p, []byte(crash), 0o600); err != nil {
		t.Fatal(err)
	}
	s := r.n.guest.BootState(t.Context(), rec)
	for _, want := range []string{"runsc panic log", "failed to create new OS thread", "fatal error: newosproc"} {
		if !strings.Contains(s, want) {
			t.Errorf("boot state %q lacks %q", s, want)
		}
	}
	if strings.Contains(s, "goroutine") || len(s) > 2048 {
		t.Errorf("boot state quotes the goroutine dump (%d bytes): %.300s", len(s), s)
	}
	r.mustRelease(sb, "op2", 1)
	r.checkClean("after release")
}
