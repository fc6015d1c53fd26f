package natsserver

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// Listen addresses are checked before the embedded server starts. nats-server reports an address it
// cannot bind only in its own log (off in fpmbus) and then never becomes ready, which a supervisor can
// only read as a server that failed to start, and restart, again and again. An address that cannot be
// bound (taken by another process, not an address of this host, a privileged port) stays so however
// often the server is restarted, so StartServer refuses it at once with ErrListen, naming the address
// and, for a taken one, the process holding it when /proc tells.

// ErrListen is wrapped by StartServer's and CheckListen's error when an address the server would
// listen on cannot be bound; the error names the listener, the address and the system's reason
// ("address already in use").
var ErrListen = errors.New("streams: cannot listen")

// ListenError is an address the server cannot listen on.
type ListenError struct {
	// Listener is what listens there: "client", "monitoring", "cluster", "gateway", "leafnode",
	// "websocket", "mqtt".
	Listener string
	Addr     string
	// Holder names the process listening there ("pid 123 (nats-server)") when it could be found.
	Holder string
	Err    error
}

func (e *ListenError) Error() string {
	msg := fmt.Sprintf("%s address %s: %v", e.Listener, e.Addr, e.Err)
	if e.Holder != "" {
		msg += "; held by " + e.Holder
	}
	return msg
}

func (e *ListenError) Unwrap() []error { return []error{ErrListen, e.Err} }

// CheckListen binds and releases every fixed address o listens on (port 0 or random: nothing to
// check). The first that cannot be bound is returned as a *ListenError.
func CheckListen(o *server.Options) error {
	type listener struct {
		name string
		host string
		port int
	}
	ls := []listener{
		{"client", o.Host, o.Port},
		{"monitoring", o.HTTPHost, o.HTTPPort},
		{"monitoring", o.HTTPHost, o.HTTPSPort},
		{"cluster", o.Cluster.Host, o.Cluster.Port},
		{"gateway", o.Gateway.Host, o.Gateway.Port},
		{"leafnode", o.LeafNode.Host, o.LeafNode.Port},
		{"websocket", o.Websocket.Host, o.Websocket.Port},
		{"mqtt", o.MQTT.Host, o.MQTT.Port},
	}
	for _, l := range ls {
		if l.port <= 0 {
			continue
		}
		if l.name != "client" && l.host == "" {
			l.host = o.Host // nats-server's default for its other listeners
		}
		addr := net.JoinHostPort(l.host, strconv.Itoa(l.port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			le := &ListenError{Listener: l.name, Addr: addr, Err: err}
			var oe *net.OpError
			if errors.As(err, &oe) && oe.Err != nil {
				le.Err = oe.Err // "bind: address already in use", without repeating the address
			}
			le.Holder = portHolder(l.port)
			return le
		}
		_ = ln.Close()
	}
	return nil
}

// portHolder names the process listening on TCP port ("pid 123 (nats-server)"), or "" when /proc does
// not tell (another system, a process of another user, no listener).
func portHolder(port int) string {
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || fs[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, ok := strings.Cut(fs[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); ok && err == nil && int(p) == port && fs[9] != "0" {
				inodes["socket:["+fs[9]+"]"] = true
			}
		}
		f.Close()
	}
	if len(inodes) == 0 {
		return ""
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, proc := range procs {
		fds, _ := os.ReadDir(filepath.Join(proc, "fd"))
		for _, fd := range fds {
			if link, err := os.Readlink(filepath.Join(proc, "fd", fd.Name())); err == nil && inodes[link] {
				pid := filepath.Base(proc)
				if comm, err := os.ReadFile(filepath.Join(proc, "comm")); err == nil {
					return fmt.Sprintf("pid %s (%s)", pid, strings.TrimSpace(string(comm)))
				}
				return "pid " + pid
			}
		}
	}
	return ""
}

// Bindable binds and releases the TCP address addr; its error is the system's reason, with the
// process holding the port when /proc tells.
func Bindable(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln.Close()
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		err = oe.Err // "bind: address already in use", without repeating the address
	}
	if _, p, serr := net.SplitHostPort(addr); serr == nil {
		if port, perr := strconv.Atoi(p); perr == nil && port > 0 {
			if h := portHolder(port); h != "" {
				return fmt.Errorf("%w; held by %s", err, h)
			}
		}
	}
	return err
}
