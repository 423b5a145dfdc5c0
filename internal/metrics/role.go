package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ctld/ctld/internal/ha"
)

var (
	roleDesc = prometheus.NewDesc("ctld_role",
		"1 for the role this instance has now (standby, starting, primary, stopping), 0 for the others.",
		[]string{"slot", "role"}, nil)
	epochDesc = prometheus.NewDesc("ctld_epoch",
		"Epoch of this instance's primary term (0: never primary).", []string{"slot"}, nil)
	healthyDesc = prometheus.NewDesc("ctld_healthy",
		"1 when this instance's health checks pass (its probe socket says ok), else 0.", []string{"slot"}, nil)
)

// roles are every role, so a dashboard sees each series at 0 or 1.
var roles = []ha.Role{ha.RoleStandby, ha.RoleStarting, ha.RolePrimary, ha.RoleStopping}

// roleCollector reads the instance's status at scrape time: a standby
// serves these (and the runtime's) only.
type roleCollector struct{ status func() ha.Status }

func (c roleCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- roleDesc
	ch <- epochDesc
	ch <- healthyDesc
}

func (c roleCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.status()
	for _, r := range roles {
		v := 0.0
		if st.Role == r {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(roleDesc, prometheus.GaugeValue, v, st.Slot, string(r))
	}
	ch <- prometheus.MustNewConstMetric(epochDesc, prometheus.GaugeValue, float64(st.Epoch), st.Slot)
	healthy := 0.0
	if st.Health == "ok" {
		healthy = 1
	}
	ch <- prometheus.MustNewConstMetric(healthyDesc, prometheus.GaugeValue, healthy, st.Slot)
}
