package streams_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// A component's bucket settings create a missing bucket and never change an existing one: a shorter
// TTL or smaller size from a component's flags would delete what the bucket holds.
func TestEnsureKeyValueKeepsExistingBucket(t *testing.T) {
	env := natsservertest.Start(t)
	ctx := t.Context()
	mine := jetstream.KeyValueConfig{Bucket: "STATE", History: 1, Storage: jetstream.FileStorage, Replicas: 1}
	kv, err := streams.EnsureKeyValue(ctx, env.JS, mine)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := kv.Status(ctx); st.History() != 1 || st.TTL() != 0 {
		t.Fatalf("created bucket: history %d ttl %v", st.History(), st.TTL())
	}
	// The operator gives it history and a size limit and stores keys.
	if _, err := env.JS.UpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "STATE", History: 8, MaxBytes: 1 << 20, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := kv.Put(ctx, "k", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	kv, err = streams.EnsureKeyValue(ctx, env.JS, mine)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.History() != 8 || st.TTL() != time.Hour || st.Values() != 3 {
		t.Fatalf("existing bucket changed: history %d ttl %v values %d; want 8, 1h, 3", st.History(), st.TTL(), st.Values())
	}
}

func TestEnsureObjectStoreKeepsExistingBucket(t *testing.T) {
	env := natsservertest.Start(t)
	ctx := t.Context()
	obs, err := streams.EnsureObjectStore(ctx, env.JS, jetstream.ObjectStoreConfig{Bucket: "BODIES", TTL: 90 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutBytes(ctx, "a", []byte("artefact")); err != nil {
		t.Fatal(err)
	}
	// A component started with a one-minute --bench-max-age: the bucket keeps its 90 days.
	obs, err = streams.EnsureObjectStore(ctx, env.JS, jetstream.ObjectStoreConfig{Bucket: "BODIES", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	st, err := obs.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != 90*24*time.Hour {
		t.Fatalf("existing object bucket's TTL changed to %v", st.TTL())
	}
	if b, err := obs.GetBytes(ctx, "a"); err != nil || !bytes.Equal(b, []byte("artefact")) {
		t.Fatalf("object a: %q, %v", b, err)
	}
}
