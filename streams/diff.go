package streams

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Change is one stream setting whose value on the server (Current) differs from the wanted one.
// Setting is the JSON name `fpmbus streams show` and `nats stream info --json` print; Current and
// Wanted are the values in the units of fpmbus's flags ("unlimited" for a limit that is not set).
type Change struct {
	Stream  string
	Setting string
	Current string
	Wanted  string
	// Destructive: applying the change can delete messages the stream holds now or lets in later than
	// it would today (a lower limit, discard old instead of new), keep fewer copies of them (fewer
	// replicas), or cannot be applied in place at all (storage type, work-queue retention: the server
	// refuses; recreating the stream loses its messages).
	Destructive bool
}

// String is the plan line `fpmbus streams apply` prints: "FPM max_bytes 2097152 -> 100000".
func (c Change) String() string {
	return fmt.Sprintf("%s %s %s -> %s", c.Stream, c.Setting, c.Current, c.Wanted)
}

// Diff lists the settings fpmbus defines (those of Config.All: subjects, retention, discard, the
// limits, storage, replicas, duplicate window, direct get) whose value in current differs from wanted,
// in that order. Settings fpmbus does not define (description, compression, placement, metadata, …)
// are never compared: they belong to whoever set them. Values are compared as the server applies
// them: 0 and -1 both mean an unlimited limit, a missing duplicate window is the server's default.
func Diff(current, wanted jetstream.StreamConfig) []Change {
	var out []Change
	add := func(setting, cur, want string, destructive bool) {
		if cur != want {
			out = append(out, Change{Stream: wanted.Name, Setting: setting, Current: cur, Wanted: want, Destructive: destructive})
		}
	}
	add("subjects", strings.Join(subjectSet(current), ","), strings.Join(subjectSet(wanted), ","), false)
	// Interest and work-queue retention delete acknowledged messages; the server refuses any change to
	// or from work-queue retention.
	add("retention", enumName(current.Retention), enumName(wanted.Retention),
		wanted.Retention != jetstream.LimitsPolicy || current.Retention == jetstream.WorkQueuePolicy)
	// Discard old at a full stream deletes the oldest message for every new one; discard new refuses
	// the new one instead and keeps what is stored.
	add("discard", enumName(current.Discard), enumName(wanted.Discard), wanted.Discard == jetstream.DiscardOld)
	limit := func(setting string, cur, want int64) {
		cur, want = unlimited(cur), unlimited(want)
		add(setting, formatLimit(cur), formatLimit(want), want < cur)
	}
	limit("max_msgs", current.MaxMsgs, wanted.MaxMsgs)
	limit("max_bytes", current.MaxBytes, wanted.MaxBytes)
	curAge, wantAge := unlimited(int64(current.MaxAge)), unlimited(int64(wanted.MaxAge))
	add("max_age", formatAge(curAge), formatAge(wantAge), wantAge < curAge)
	limit("max_msgs_per_subject", current.MaxMsgsPerSubject, wanted.MaxMsgsPerSubject)
	// A smaller max_msg_size deletes nothing stored, but refuses messages (benchmark artefacts) the
	// stream accepts today: data lost at the publisher instead.
	limit("max_msg_size", int64(current.MaxMsgSize), int64(wanted.MaxMsgSize))
	// max_consumers bounds readers, not data.
	add("max_consumers", formatLimit(unlimited(int64(current.MaxConsumers))), formatLimit(unlimited(int64(wanted.MaxConsumers))), false)
	add("storage", enumName(current.Storage), enumName(wanted.Storage), true)
	add("num_replicas", fmt.Sprint(replicas(current)), fmt.Sprint(replicas(wanted)), replicas(wanted) < replicas(current))
	add("duplicate_window", duplicateWindow(current).String(), duplicateWindow(wanted).String(), false)
	add("allow_direct", fmt.Sprint(current.AllowDirect), fmt.Sprint(wanted.AllowDirect), false)
	// Atomic batch publish is only ever turned on: it deletes nothing and changes nothing a
	// reader sees; fpmbus never turns off what an operator turned on.
	if wanted.AllowAtomicPublish && !current.AllowAtomicPublish {
		add("allow_atomic", "false", "true", false)
	}
	return out
}

// withSettings returns current with every setting Diff compares taken from wanted: what
// `fpmbus streams apply` sends, so that the settings fpmbus does not define stay as they are.
func withSettings(current, wanted jetstream.StreamConfig) jetstream.StreamConfig {
	out := current
	out.Subjects = slices.Clone(wanted.Subjects)
	out.Retention = wanted.Retention
	out.Discard = wanted.Discard
	out.MaxMsgs = wanted.MaxMsgs
	out.MaxBytes = wanted.MaxBytes
	out.MaxAge = wanted.MaxAge
	out.MaxMsgsPerSubject = wanted.MaxMsgsPerSubject
	out.MaxMsgSize = wanted.MaxMsgSize
	out.MaxConsumers = wanted.MaxConsumers
	out.Storage = wanted.Storage
	out.Replicas = wanted.Replicas
	out.Duplicates = wanted.Duplicates
	out.AllowDirect = wanted.AllowDirect
	out.AllowAtomicPublish = current.AllowAtomicPublish || wanted.AllowAtomicPublish
	return out
}

// unlimited maps the server's "no limit" values (0 and any negative) to MaxInt64, so that a lower
// limit compares lower.
func unlimited(v int64) int64 {
	if v <= 0 {
		return math.MaxInt64
	}
	return v
}

func formatLimit(v int64) string {
	if v == math.MaxInt64 {
		return "unlimited"
	}
	return fmt.Sprint(v)
}

func formatAge(v int64) string {
	if v == math.MaxInt64 {
		return "unlimited"
	}
	return time.Duration(v).String()
}

// subjectSet is the stream's subjects sorted; the server gives a stream without subjects its name.
func subjectSet(sc jetstream.StreamConfig) []string {
	if len(sc.Subjects) == 0 {
		return []string{sc.Name}
	}
	s := slices.Clone(sc.Subjects)
	slices.Sort(s)
	return slices.Compact(s)
}

func replicas(sc jetstream.StreamConfig) int {
	return max(sc.Replicas, 1)
}

// serverDuplicateWindow is what the server uses when a stream is created without one.
const serverDuplicateWindow = 2 * time.Minute

// duplicateWindow is the window the server applies: the given one, else 2 minutes capped at max age.
func duplicateWindow(sc jetstream.StreamConfig) time.Duration {
	if sc.Duplicates > 0 {
		return sc.Duplicates
	}
	if sc.MaxAge > 0 && sc.MaxAge < serverDuplicateWindow {
		return sc.MaxAge
	}
	return serverDuplicateWindow
}

// enumName is a jetstream enum's JSON value ("limits", "old", "file"), the name `streams show` prints.
func enumName(v json.Marshaler) string {
	b, err := v.MarshalJSON()
	if err != nil {
		return fmt.Sprint(v)
	}
	return strings.Trim(string(b), `"`)
}
