package partition

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
)

// StableMemberID names a process that owns directory dataDir in its consumer groups:
// "<prefix><host>-<hash of the absolute directory>" (`fpmbus up`: "up-"). When only one process can
// hold the directory (`fpmbus up` locks its --data-dir), the id names the same instance across
// restarts, and a restart after a crash takes the partitions of its previous incarnation back at once
// (WithMemberID).
func StableMemberID(prefix, dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	host, _ := os.Hostname()
	var b strings.Builder
	b.WriteString(prefix)
	for i := 0; i < len(host) && i < 32; i++ {
		if c := host[i]; c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	sum := sha256.Sum256([]byte(abs))
	b.WriteString("-" + hex.EncodeToString(sum[:6]))
	return b.String()
}
