// Package rungroup runs the long-lived components of one process as one supervised group.
//
// Components are declared as data: an ordered list of Component values, each with a name, a Start
// function that builds one incarnation (its Run and Ready), the components it Needs, a ready and a stop
// deadline, and a restart Policy. The group keeps these invariants:
//
//   - Start order is list order: a component is started once every component before it is ready.
//     Stop order is the reverse of list order.
//   - A component whose Run returns without having been asked to stop has failed. It is restarted after
//     an exponential backoff; every component that needs it, directly or through others, is stopped
//     before it (in reverse order) and started again after it (in list order), so a restart hands its
//     fresh resources (a new connection) to everything built on them.
//   - A component that fails more than Policy.MaxRestarts times within Policy.Window, or with a
//     Permanent error, cannot recover: the group stops every other component in reverse order and Run
//     returns an error wrapping ErrGaveUp. The group never runs on with a dead component.
//   - A running incarnation may report a fault that restarting it would not fix (Instance.Health: a
//     full disk under a server): Status and the health report show it StateDegraded with the fault
//     as its Reason, /healthz answers 503, and the group restarts nothing for it. The incarnation
//     handles the fault itself (and fails, to be restarted, only if it cannot).
//   - A component listed Disabled (a setting it refuses that the process runs on without) is never
//     started: Status lists it StateDisabled with the reason, logged once at error level when Run
//     starts, and /healthz answers 503 "degraded" for as long as the process runs without it.
//   - Stopping an incarnation cancels its context and waits for its Run to return, at most the
//     component's StopTimeout; one that overruns is logged and abandoned, so no component can hold the
//     process.
//
// Ownership: the goroutine calling Run owns every incarnation and all supervision state. Status,
// Healthy and ServeHTTP read a snapshot kept under a mutex and may be called from any goroutine, before,
// during and after Run.
package rungroup
