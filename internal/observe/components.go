package observe

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/internal/rungroup"
)

// The components' health as metrics, for every process the same way: `up`'s run group and a standalone
// command's one component are exported under the same names and labels, from the health /healthz
// serves (limit checks applied), so a dashboard or an alert reads a systemd deployment of standalone
// commands as it reads `up`, and a component behind one of its limits (the bridge dropping for a full
// buffer, a consumer overtaken by its stream's retention) shows as degraded there too.

var (
	componentStateDesc = prometheus.NewDesc("fpmbus_component_state",
		"1 for the state a component is in as /healthz reports it (starting, ready, degraded, restarting, failed, stopped, disabled; "+
			"degraded includes a ready component behind one of its limits), 0 for the others.",
		[]string{"component", "state"}, nil)
	componentReadyDesc = prometheus.NewDesc("fpmbus_component_ready",
		"1 while a component runs ready (degraded included: it runs, with a fault or behind a limit), else 0.",
		[]string{"component"}, nil)
	componentRestartsDesc = prometheus.NewDesc("fpmbus_component_restarts_total",
		"Restarts of a component by `up`'s run group (after its own failure or one of a component it needs); "+
			"a standalone command's component restarts with its process, so it stays 0 there.",
		[]string{"component"}, nil)
)

// componentCollector exports the server's health: fpmbus_component_state{component,state},
// fpmbus_component_ready{component} and fpmbus_component_restarts_total{component}.
type componentCollector struct{ s *Server }

func (c componentCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- componentStateDesc
	ch <- componentReadyDesc
	ch <- componentRestartsDesc
}

func (c componentCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.s.health(c.s.jetStreamCached()) {
		for _, state := range rungroup.States {
			ch <- prometheus.MustNewConstMetric(componentStateDesc, prometheus.GaugeValue, one(st.State == state), st.Name, string(state))
		}
		ch <- prometheus.MustNewConstMetric(componentReadyDesc, prometheus.GaugeValue,
			one(st.State == rungroup.StateReady || st.State == rungroup.StateDegraded), st.Name)
		ch <- prometheus.MustNewConstMetric(componentRestartsDesc, prometheus.CounterValue, float64(st.Restarts), st.Name)
	}
}

func one(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
