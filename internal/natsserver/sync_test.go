package natsserver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fpmbus/fpmbus/internal/natsserver"
)

func TestParseSyncPolicy(t *testing.T) {
	tests := map[string]struct {
		in   string
		want natsserver.SyncPolicy
		bad  bool
	}{
		"always":              {in: "always", want: natsserver.SyncAlways},
		"always, any case":    {in: " Always ", want: natsserver.SyncAlways},
		"nats-server's 2m":    {in: "2m", want: natsserver.SyncPolicy{Interval: 2 * time.Minute}},
		"a second":            {in: "1s", want: natsserver.SyncPolicy{Interval: time.Second}},
		"zero":                {in: "0s", bad: true},
		"negative":            {in: "-1s", bad: true},
		"not a duration":      {in: "often", bad: true},
		"empty":               {in: "", bad: true},
		"a bare number (ms?)": {in: "100", bad: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := natsserver.ParseSyncPolicy(tc.in)
			if tc.bad {
				if !errors.Is(err, natsserver.ErrBadSync) {
					t.Fatalf("ParseSyncPolicy(%q) = %v, %v; want ErrBadSync", tc.in, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseSyncPolicy(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
			if again, err := natsserver.ParseSyncPolicy(got.String()); err != nil || again != got {
				t.Fatalf("%v does not round-trip through String: %v %v", got, again, err)
			}
		})
	}
}

// TestEmbeddedServerSyncPolicy: the embedded server runs JetStream with the policy it is given, and
// with natsserver.DefaultSync (always) when given none.
func TestEmbeddedServerSyncPolicy(t *testing.T) {
	tests := map[string]struct {
		sync         natsserver.SyncPolicy
		wantAlways   bool
		wantInterval time.Duration
	}{
		"default is always": {wantAlways: true, wantInterval: natsserver.ServerDefaultSyncInterval},
		"always":            {sync: natsserver.SyncAlways, wantAlways: true, wantInterval: natsserver.ServerDefaultSyncInterval},
		"an interval":       {sync: natsserver.SyncPolicy{Interval: 10 * time.Second}, wantInterval: 10 * time.Second},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: "127.0.0.1:0", StoreDir: t.TempDir(), Sync: tc.sync})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = srv.Shutdown(context.Background()) }()
			jc := srv.NATS().JetStreamConfig()
			if jc == nil || jc.SyncAlways != tc.wantAlways || jc.SyncInterval != tc.wantInterval {
				t.Fatalf("JetStream config %+v, want sync always %v, interval %v", jc, tc.wantAlways, tc.wantInterval)
			}
		})
	}
}

// The policy a server runs with is what logs name: an unset Sync is the configuration file's
// sync_interval, else always; never the zero value.
func TestEffectiveSync(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg  natsserver.ServerConfig
		want string
	}{
		"nothing set":          {natsserver.ServerConfig{}, "always"},
		"Sync set":             {natsserver.ServerConfig{Sync: natsserver.SyncPolicy{Interval: 2 * time.Minute}}, "2m0s"},
		"file's interval":      {natsserver.ServerConfig{Base: &server.Options{SyncInterval: 30 * time.Second}}, "30s"},
		"file's always":        {natsserver.ServerConfig{Base: &server.Options{SyncAlways: true}}, "always"},
		"file without sync":    {natsserver.ServerConfig{Base: &server.Options{}}, "always"},
		"Sync over the file's": {natsserver.ServerConfig{Sync: natsserver.SyncAlways, Base: &server.Options{SyncInterval: time.Minute}}, "always"},
	} {
		if got := tc.cfg.EffectiveSync().String(); got != tc.want {
			t.Errorf("%s: %s, want %s", name, got, tc.want)
		}
	}
}
