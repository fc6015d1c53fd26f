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
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) { // another component created it meanwhile
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("streams: key-value bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// EnsureObjectStore opens object bucket cfg.Bucket, creating it from cfg when it does not exist.
func EnsureObjectStore(ctx context.Context, js jetstream.JetStream, cfg jetstream.ObjectStoreConfig) (jetstream.ObjectStore, error) {
	obs, err := js.ObjectStore(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		obs, err = js.CreateObjectStore(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) { // another component created it meanwhile
			obs, err = js.ObjectStore(ctx, cfg.Bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("streams: object bucket %s: %w", cfg.Bucket, err)
	}
	return obs, nil
}
