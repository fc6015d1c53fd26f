package fsutil

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// lockHolders lists the processes /proc/locks names as holding a lock on f's file (waiters, "->",
// excluded), with their command lines; nil when /proc/locks cannot be read.
func lockHolders(f *os.File) []Process {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return nil
	}
	locks, err := os.Open("/proc/locks")
	if err != nil {
		return nil
	}
	defer locks.Close()
	dev := uint64(st.Dev)
	major := (dev>>8)&0xfff | (dev>>32)&^0xfff
	minor := dev&0xff | (dev>>12)&^0xff
	out := []Process{}
	seen := map[int]bool{}
	sc := bufio.NewScanner(locks)
	for sc.Scan() {
		// "1: FLOCK  ADVISORY  WRITE 2291 fd:01:1234567 0 EOF"
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] == "->" {
			continue
		}
		pid, err := strconv.Atoi(fields[4])
		if err != nil || pid <= 0 || seen[pid] {
			continue
		}
		id := strings.Split(fields[5], ":")
		if len(id) != 3 {
			continue
		}
		maj, err1 := strconv.ParseUint(id[0], 16, 64)
		min, err2 := strconv.ParseUint(id[1], 16, 64)
		ino, err3 := strconv.ParseUint(id[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || maj != major || min != minor || ino != uint64(st.Ino) {
			continue
		}
		seen[pid] = true
		out = append(out, Process{PID: pid, Command: commandLine(pid)})
	}
	return out
}

// commandLine is /proc/<pid>/cmdline with spaces for its NULs, bounded; "" when it cannot be read.
func commandLine(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	b = bytes.TrimRight(b, "\x00")
	s := string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
	if len(s) > maxCommand {
		s = s[:maxCommand] + "…"
	}
	return s
}
