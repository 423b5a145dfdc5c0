package layering

import (
	"slices"
	"strings"
	"testing"
)

// Metrics are taken at the edges (cmd/ctld, internal/metrics): the node,
// the journal and the kernel packages offer plain hooks (a func, an
// interface) and never link Prometheus, so a metric never changes what
// they do or what a writer process carries.
func TestCorePackagesDoNotLinkPrometheus(t *testing.T) {
	for _, pkg := range []string{"internal/node", "internal/journal", "internal/netpolicy/dnsproxy", "internal/netpolicy/nft", "internal/apiserver", "internal/writer", "internal/nbdsrv"} {
		if i := slices.IndexFunc(deps(t, pkg), func(d string) bool { return strings.HasPrefix(d, "github.com/prometheus/") }); i >= 0 {
			t.Errorf("%s links %s", pkg, deps(t, pkg)[i])
		}
	}
	if !slices.Contains(deps(t, "cmd/ctld"), "github.com/prometheus/client_golang/prometheus") {
		t.Errorf("cmd/ctld does not link client_golang: the check above proves nothing")
	}
}
