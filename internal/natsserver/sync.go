package natsserver

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// SyncPolicy is when a JetStream server fsyncs what it stores: after every write (Always), or in the
// background every Interval. It is a server-wide setting (nats-server's `jetstream { sync_interval }`,
// server.Options.SyncAlways / SyncInterval): every stream and KV bucket of the server shares it.
//
// JetStream acknowledges a publish once the message is written to the operating system, not once it
// is on disk. With an interval, a power loss or OS crash of the node loses what was acknowledged since
// the last background fsync, and nothing tells the publisher; a process kill loses nothing (the page
// cache survives it). With Always, a write is on disk before it is acknowledged. On a cluster, Always
// makes a replicated stream sync its log when it flushes, before the leader counts the write as
// committed.
type SyncPolicy struct {
	// Always fsyncs every write before it is acknowledged.
	Always bool
	// Interval is the background fsync period when Always is false.
	Interval time.Duration
}

// ServerDefaultSyncInterval is nats-server's own default when sync_interval is not configured: an
// acknowledged message may stay in the page cache for up to two minutes.
const ServerDefaultSyncInterval = 2 * time.Minute

// SyncAlways fsyncs every write before it is acknowledged.
var SyncAlways = SyncPolicy{Always: true}

// DefaultSync is fpmbus's policy for the embedded server (`fpmbus up --sync`) and the shipped server
// configurations (ops/nats/): always. The README's durability section gives the measured cost; the
// FPM_DATASETS first-writer-wins and the FPM_BENCH artefacts rest on acknowledged writes that must
// outlive a power cut, and one server has one policy for all of them.
var DefaultSync = SyncAlways

// ErrBadSync is wrapped by ParseSyncPolicy's errors.
var ErrBadSync = errors.New("streams: bad sync policy")

// ParseSyncPolicy reads `always` or a positive duration (`2m`, `30s`), the values nats-server's
// sync_interval takes.
func ParseSyncPolicy(s string) (SyncPolicy, error) {
	s = strings.TrimSpace(s)
	if strings.EqualFold(s, "always") {
		return SyncAlways, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return SyncPolicy{}, fmt.Errorf("%w: %q: want always or a duration such as 2m", ErrBadSync, s)
	}
	if d <= 0 {
		return SyncPolicy{}, fmt.Errorf("%w: %q: the interval must be positive", ErrBadSync, s)
	}
	return SyncPolicy{Interval: d}, nil
}

// String is the policy as ParseSyncPolicy and nats-server's sync_interval read it.
func (p SyncPolicy) String() string {
	if p.Always {
		return "always"
	}
	return p.Interval.String()
}

// Set and the String method make *SyncPolicy a flag.Value.
func (p *SyncPolicy) Set(s string) error {
	v, err := ParseSyncPolicy(s)
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// applyTo sets the policy on a server's options; the zero policy means DefaultSync. Always keeps
// nats-server's default interval beside SyncAlways, as its config parser does for
// `sync_interval: always`.
func (p SyncPolicy) applyTo(opts *server.Options) {
	if p == (SyncPolicy{}) {
		p = DefaultSync
	}
	if p.Always {
		opts.SyncAlways, opts.SyncInterval = true, ServerDefaultSyncInterval
		return
	}
	opts.SyncAlways, opts.SyncInterval = false, p.Interval
}

// EffectiveSync is the policy StartServer runs c's server with: Sync when set, else the Base
// configuration's sync_interval when it sets one, else DefaultSync. Logs and health name this one, never
// the zero value of an unset Sync.
func (c ServerConfig) EffectiveSync() SyncPolicy {
	switch {
	case c.Sync != (SyncPolicy{}):
		return c.Sync
	case c.Base != nil && c.Base.SyncAlways:
		return SyncAlways
	case c.Base != nil && c.Base.SyncInterval > 0:
		return SyncPolicy{Interval: c.Base.SyncInterval}
	}
	return DefaultSync
}
