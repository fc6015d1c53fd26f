package observe

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// ComponentRegistry registers one component's metrics on the process registry. Each incarnation gets
// it through Renew, which first unregisters the previous incarnation's collectors: a restarted
// component counts from zero, as a restarted process would, instead of failing to register twice.
type ComponentRegistry struct {
	reg prometheus.Registerer
	mu  sync.Mutex
	cs  []prometheus.Collector
}

// NewComponentRegistry returns the registry of one component's metrics on reg.
func NewComponentRegistry(reg prometheus.Registerer) *ComponentRegistry {
	return &ComponentRegistry{reg: reg}
}

// Renew unregisters what the previous incarnation registered and returns r for the next one.
func (r *ComponentRegistry) Renew() prometheus.Registerer {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.cs {
		r.reg.Unregister(c)
	}
	r.cs = nil
	return r
}

func (r *ComponentRegistry) Register(c prometheus.Collector) error {
	if err := r.reg.Register(c); err != nil {
		return err
	}
	r.mu.Lock()
	r.cs = append(r.cs, c)
	r.mu.Unlock()
	return nil
}

func (r *ComponentRegistry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *ComponentRegistry) Unregister(c prometheus.Collector) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, have := range r.cs {
		if have == c {
			r.cs = append(r.cs[:i], r.cs[i+1:]...)
			break
		}
	}
	return r.reg.Unregister(c)
}
