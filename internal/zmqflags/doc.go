// Package zmqflags defines, once, the command-line flags that say where the data-parallel ranks of a
// Dynamo worker have their FPM PUB sockets: --fpm-port, the base port (Dynamo's
// DYN_FORWARDPASS_METRIC_PORT; rank r uses port+r), and --dp-size, the number of ranks. The bridge
// connects to that block and the synthetic publisher binds it; both register the flags and check the
// parsed block here, so that the two commands read, default and blame them alike.
//
// Invariants:
//   - A block that passes CheckPorts has every rank's port in 1..65535.
//   - An error names what the user chose: --dp-size when given, else --fpm-port when given, else where
//     the base port's default came from (an environment variable, or the package default).
package zmqflags
