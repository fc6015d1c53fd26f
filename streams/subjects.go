package streams

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Subject roots and wildcards.
const (
	FPMRoot        = "fpm"
	eventsRoot     = "fpmevents"
	benchRoot      = "fpmbench"
	FPMWildcard    = FPMRoot + ".>"
	EventsWildcard = eventsRoot + ".>"
	BenchWildcard  = benchRoot + ".>"

	DeadLetterWildcard = eventsRoot + ".deadletter.>"
	// consumerDeadLetterRoot is the root of ConsumerDeadLetterSubject, under DeadLetterWildcard.
	consumerDeadLetterRoot = eventsRoot + ".deadletter.consumer"
	// DropMarkerRoot and gapEventRoot are the roots of DropMarkerSubject and GapEventSubject (for
	// ParseKeySubject).
	DropMarkerRoot     = eventsRoot + ".drop"
	gapEventRoot       = eventsRoot + ".gap"
	DropMarkerWildcard = DropMarkerRoot + ".>"
	GapEventWildcard   = gapEventRoot + ".>"
)

// ErrBadSubject is returned when a subject does not follow the scheme.
var ErrBadSubject = errors.New("streams: subject does not follow the fpmbus scheme")

// Key identifies one FPM publisher: one DP rank of one worker. Subjects carry it as four tokens
// (namespace.component.worker_id.dp_rank); JSON bodies (drop markers, gap events, the gap detector's
// state) carry it as this object.
type Key struct {
	Namespace string `json:"namespace"`
	Component string `json:"component"`
	WorkerID  string `json:"worker_id"`
	DPRank    int    `json:"dp_rank"`
}

func (k Key) String() string {
	return fmt.Sprintf("%s/%s/%s/%d", k.Namespace, k.Component, k.WorkerID, k.DPRank)
}

// EncodeToken percent-encodes s as Dynamo's event plane does: ASCII letters, digits, '-' and '_' are
// kept, every other byte becomes %XX (uppercase hex), so '.', '*', '>' and spaces can never split or
// widen a subject. NATS forbids empty tokens and Dynamo's default worker_id is "", so the empty string
// encodes as a lone "%", which the byte rule can never produce.
func EncodeToken(s string) string {
	if s == "" {
		return "%"
	}
	if ValidName(s, len(s)) {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) * 3)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if keepByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0xF])
	}
	return b.String()
}

// decodeToken reverses EncodeToken.
func decodeToken(tok string) (string, error) {
	if tok == "%" {
		return "", nil
	}
	if !strings.Contains(tok, "%") {
		return tok, nil
	}
	out := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		if tok[i] != '%' {
			out = append(out, tok[i])
			continue
		}
		if i+2 >= len(tok) {
			return "", fmt.Errorf("%w: token %q: truncated escape at byte %d", ErrBadSubject, tok, i)
		}
		v, err := strconv.ParseUint(tok[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("%w: token %q: bad escape at byte %d", ErrBadSubject, tok, i)
		}
		out = append(out, byte(v))
		i += 2
	}
	return string(out), nil
}

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

func keepByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// FPMSubject is the subject one FPM of k is published on.
func FPMSubject(k Key) string {
	return FPMRoot + "." + keyTokens(k)
}

// DropMarkerSubject carries the bridge's drop markers for k.
func DropMarkerSubject(k Key) string {
	return DropMarkerRoot + "." + keyTokens(k)
}

// DropMarkerFilter is the drop-marker subject filter of the publishers an FPM subject filter selects
// (fpm.> gives fpmevents.drop.>, fpm.dynamo.backend.> gives fpmevents.drop.dynamo.backend.>).
func DropMarkerFilter(fpmFilter string) string {
	return DropMarkerRoot + "." + strings.TrimPrefix(fpmFilter, FPMRoot+".")
}

// GapEventSubject carries the gap events for k: the gap detector's and the bridge's lost_after_ack.
func GapEventSubject(k Key) string {
	return gapEventRoot + "." + keyTokens(k)
}

// DeadLetterSubject carries input from one DP rank's socket that could not be decoded or validated.
// The worker_id is unknown when the payload does not decode, so the subject names the socket's rank only.
func DeadLetterSubject(namespace, component string, dpRank int) string {
	return eventsRoot + ".deadletter." + EncodeToken(namespace) + "." + EncodeToken(component) + "." + strconv.Itoa(dpRank)
}

// ConsumerDeadLetterSubject carries the stored messages that consumer (its durable name) can never
// process. It has one token fewer than a bridge's DeadLetterSubject, so the two never collide.
func ConsumerDeadLetterSubject(consumer string) string {
	return consumerDeadLetterRoot + "." + EncodeToken(consumer)
}

// keyTokens is the key part of k's subjects: <namespace>.<component>.<worker_id>.<dp_rank>, each token
// encoded with EncodeToken.
func keyTokens(k Key) string {
	return EncodeToken(k.Namespace) + "." + EncodeToken(k.Component) + "." + EncodeToken(k.WorkerID) + "." + strconv.Itoa(k.DPRank)
}

// KVKeyTokens is keyTokens(k) as it stands in a KV key: '%' (not allowed in KV keys) written as '='
// (which EncodeToken never produces).
func KVKeyTokens(k Key) string {
	return strings.ReplaceAll(keyTokens(k), "%", "=")
}

// ParseKVKeyTokens parses KVKeyTokens(k) back into k.
func ParseKVKeyTokens(tokens string) (Key, error) {
	return parseKeyTokens(strings.ReplaceAll(tokens, "=", "%"), tokens)
}

// ParseFPMSubject parses fpm.<ns>.<comp>.<worker>.<rank> (or a drop/gap event subject's key part when
// given root "fpmevents.drop"/"fpmevents.gap") back into a Key.
func ParseFPMSubject(subject string) (Key, error) {
	return parseKeySubject(subject, FPMRoot)
}

// ParseKeySubject parses <root>.<ns>.<comp>.<worker>.<rank>, where root may span several tokens.
func ParseKeySubject(subject, root string) (Key, error) {
	return parseKeySubject(subject, root)
}

func parseKeySubject(subject, root string) (Key, error) {
	rest, ok := strings.CutPrefix(subject, root+".")
	if !ok {
		return Key{}, fmt.Errorf("%w: %q does not start with %q", ErrBadSubject, subject, root+".")
	}
	return parseKeyTokens(rest, subject)
}

// parseKeyTokens parses <ns>.<comp>.<worker>.<rank>, the key part of subject (named in errors).
func parseKeyTokens(rest, subject string) (Key, error) {
	toks := strings.Split(rest, ".")
	if len(toks) != 4 {
		return Key{}, fmt.Errorf("%w: %q has %d key tokens, want 4 (namespace.component.worker_id.dp_rank)", ErrBadSubject, subject, len(toks))
	}
	var k Key
	var err error
	for i, dst := range []*string{&k.Namespace, &k.Component, &k.WorkerID} {
		if *dst, err = decodeToken(toks[i]); err != nil {
			return Key{}, err
		}
	}
	rank, err := strconv.Atoi(toks[3])
	if err != nil || rank < 0 {
		return Key{}, fmt.Errorf("%w: %q: dp_rank %q is not a non-negative integer", ErrBadSubject, subject, toks[3])
	}
	k.DPRank = rank
	return k, nil
}
