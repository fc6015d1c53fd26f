package streams

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Buckets follow the rule streams do (see Ensure): a component creates a KV or object bucket that is
// missing, from its own settings, and uses an existing one as it is. A bucket's settings (TTL, size,
// history, replicas) belong to whoever created or last changed it on purpose; re-applying a
// component's flags at start could shorten a TTL and delete what the bucket holds.

// EnsureKeyValue opens KV bucket cfg.Bucket, creating it from cfg when it does not exist.
func EnsureKeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	return ensureBucket(ctx, "key-value", cfg.Bucket, cfg.Replicas, js.KeyValue,
		func(ctx context.Context) (jetstream.KeyValue, error) { return js.CreateKeyValue(ctx, cfg) })
}

// EnsureObjectStore opens object bucket cfg.Bucket, creating it from cfg when it does not exist.
func EnsureObjectStore(ctx context.Context, js jetstream.JetStream, cfg jetstream.ObjectStoreConfig) (jetstream.ObjectStore, error) {
	return ensureBucket(ctx, "object", cfg.Bucket, cfg.Replicas, js.ObjectStore,
		func(ctx context.Context) (jetstream.ObjectStore, error) { return js.CreateObjectStore(ctx, cfg) })
}

// ensureBucket opens bucket name with open, creating it with create when it does not exist (waiting,
// as streams do, for a cluster that cannot place its replicas yet); kind names the bucket's kind in
// the error.
func ensureBucket[B any](ctx context.Context, kind, name string, replicas int, open func(context.Context, string) (B, error),
	create func(context.Context) (B, error)) (B, error) {
	b, err := open(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		b, err = placed(ctx, kind+" bucket "+name, replicas, create)
		if errors.Is(err, jetstream.ErrBucketExists) { // another component created it meanwhile
			b, err = open(ctx, name)
		}
	}
	if err != nil {
		var none B
		return none, fmt.Errorf("streams: %s bucket %s: %w", kind, name, err)
	}
	return b, nil
}
