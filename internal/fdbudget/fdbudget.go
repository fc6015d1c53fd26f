package fdbudget

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ErrExceeded is wrapped by Check's error when the descriptors asked for do not fit the limit.
var ErrExceeded = errors.New("file descriptor limit too low")

// reserve is how many descriptors Check keeps free beyond those asked for: the process's connections,
// files and libzmq's own (its context's threads and mailboxes).
const reserve = 64

// Check reports whether n more descriptors fit under the process's limit, with the descriptors open now
// and Reserve more. what names what needs them ("3000 PUB sockets, one per rank of the recording").
// Where the limit or the open descriptors cannot be read (not Linux), Check returns nil.
func Check(what string, n int) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return nil
	}
	open, err := InUse()
	if err != nil {
		return nil
	}
	return check(what, n, open, lim.Cur, lim.Max)
}

// check is Check on given figures: open descriptors, the soft and the hard limit.
func check(what string, n, open int, soft, hard uint64) error {
	need := uint64(open) + uint64(n) + reserve
	if n <= 0 || need <= soft {
		return nil
	}
	raise := fmt.Sprintf("raise it to at least %d (`ulimit -n %d`, or LimitNOFILE=%d in a systemd unit)", need, need, need)
	if hard < need {
		raise = fmt.Sprintf("raise it and the hard limit (%d) to at least %d (`ulimit -n %d` as root, or LimitNOFILE=%d in a systemd unit)", hard, need, need, need)
	}
	return fmt.Errorf("%w: %s need %d file descriptors; %d are open and %d are kept in reserve, and the limit (RLIMIT_NOFILE, `ulimit -n`) is %d: %s, or open fewer sockets",
		ErrExceeded, what, n, open, reserve, soft, raise)
}

// InUse returns how many descriptors the process has open (the entries of /proc/self/fd, less the
// one reading it).
func InUse() (int, error) {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return 0, err
	}
	return max(len(names)-1, 0), nil
}
