package bridge

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ephemeralPortRangePath is where Linux publishes the ephemeral (local) port range.
const ephemeralPortRangePath = "/proc/sys/net/ipv4/ip_local_port_range"

// checkEphemeralPorts reports whether the ports Dynamo binds for FPM overlap this host's ephemeral
// port range, read once from procPath ("" means ephemeralPortRangePath). The occupied block is
// basePort alone when dpSize <= 1, else basePort..basePort+dpSize: each rank binds basePort+rank and
// rank 0's benchmark synchronizer binds basePort+dpSize. A port inside the ephemeral range can be taken
// by an unrelated outbound connection before the publisher binds it, so the bind fails intermittently.
//
// It returns Dynamo's warning text on overlap, and "" when there is none or when the file cannot be
// read or parsed (for example on a non-Linux host).
func checkEphemeralPorts(basePort, dpSize int, procPath string) (warning string) {
	if procPath == "" {
		procPath = ephemeralPortRangePath
	}
	data, err := os.ReadFile(procPath)
	if err != nil {
		return ""
	}
	fields := strings.Fields(string(data))
	if len(fields) != 2 {
		return ""
	}
	low, err1 := strconv.Atoi(fields[0])
	high, err2 := strconv.Atoi(fields[1])
	if err1 != nil || err2 != nil || low < 0 || high < low {
		return ""
	}
	first, last := basePort, basePort
	if dpSize > 1 {
		last = basePort + dpSize
	}
	if first > high || last < low {
		return ""
	}
	return fmt.Sprintf("FPM ports %d-%d overlap this host's ephemeral port range %d-%d; "+
		"an outbound connection can take one of them first and the publisher bind then fails intermittently. "+
		"Set DYN_FORWARDPASS_METRIC_PORT to a base below %d.", first, last, low, high, low)
}
