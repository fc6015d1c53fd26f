package streams

// ValidName reports whether s is 1 to maxLen bytes, each an ASCII letter, digit, '-' or '_': the bytes
// EncodeToken keeps. A valid name is a subject token, a KV key token, part of a stream or consumer
// name and a file name as it is, with nothing to escape. Partition groups, member ids and consumer
// names take at most partition.MaxNameLen; pass math.MaxInt where only the bytes matter.
func ValidName(s string, maxLen int) bool {
	if s == "" || len(s) > maxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !keepByte(s[i]) {
			return false
		}
	}
	return true
}
