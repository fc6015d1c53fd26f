package rungroup

import (
	"encoding/json"
	"net/http"
	"time"
)

// Status is one component's entry in Group.Status and in the health report.
type Status struct {
	Name  string `json:"name"`
	State State  `json:"state"`
	// Since is when the component entered State.
	Since time.Time `json:"since"`
	// Restarts counts every start after the first.
	Restarts int `json:"restarts"`
	// LastError is the component's last failure (kept after it recovered); empty if it never failed.
	LastError string `json:"last_error,omitempty"`
	// Reason is, while State is StateDegraded, the fault its Health reports; while it is
	// StateDisabled, why it does not run.
	Reason string `json:"reason,omitempty"`
}

// Status returns every component's status, in list order. A ready component whose Health reports a
// fault is StateDegraded, with the fault as its Reason (Since stays when it became ready).
func (g *Group) Status() []Status {
	g.mu.Lock()
	out := make([]Status, len(g.units))
	checks := make([]func() error, len(g.units))
	for i, u := range g.units {
		out[i] = Status{Name: u.Name, State: u.state, Since: u.since, Restarts: u.restarts, LastError: u.lastErr}
		if u.state == StateDisabled {
			out[i].Reason = u.Disabled
		}
		checks[i] = u.health
	}
	g.mu.Unlock()
	for i, check := range checks {
		if check == nil || out[i].State != StateReady {
			continue
		}
		if err := check(); err != nil {
			out[i].State, out[i].Reason = StateDegraded, err.Error()
		}
	}
	return out
}

// Healthy reports whether every component is ready and none degraded or disabled.
func (g *Group) Healthy() bool {
	for _, s := range g.Status() {
		if s.State != StateReady {
			return false
		}
	}
	return true
}

// HealthReport is the JSON body of /healthz.
type HealthReport struct {
	// Status is "ok" when every component is ready; "degraded" when every one runs or is disabled
	// but some are degraded or disabled; else "unavailable" (one is starting, restarting, failed or
	// stopped).
	Status     string   `json:"status"`
	Components []Status `json:"components"`
}

// Report is the health report of components, with its HTTP status code: 200 only when every
// component is ready, 503 otherwise.
func Report(components []Status) (HealthReport, int) {
	rep := HealthReport{Status: "ok", Components: components}
	code := http.StatusOK
	for _, s := range components {
		switch s.State {
		case StateReady:
		case StateDegraded, StateDisabled:
			if rep.Status == "ok" {
				rep.Status, code = "degraded", http.StatusServiceUnavailable
			}
		default:
			rep.Status, code = "unavailable", http.StatusServiceUnavailable
		}
	}
	return rep, code
}

// WriteReport writes rep as indented JSON with code.
func WriteReport(w http.ResponseWriter, rep HealthReport, code int) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // reasons quote nats-server, whose stream names read "$G > FPM"
	_ = enc.Encode(rep)
}

// ServeHTTP serves the health report as JSON (Report): every component's status, in list order.
func (g *Group) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	rep, code := Report(g.Status())
	WriteReport(w, rep, code)
}
