package seal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
)

// KeyArg is the key a command-line KEY names: a full key as it is, else a campaign id's key.
func KeyArg(s string) string {
	if strings.HasPrefix(s, schemas.CellKeyPrefix) || strings.HasPrefix(s, schemas.CampaignKeyPrefix) {
		return s
	}
	return CampaignKey(s)
}

// WriteRecord writes key's record as every reader reads it (a cell's first revision that is a seal, a
// campaign's first frozen plan and its legitimate successors) as indented JSON, with the revisions
// ignored as tampering (`fpmbus datasets get`); arg is the KEY as given, for messages.
func WriteRecord(ctx context.Context, kv jetstream.KeyValue, key, arg string, w io.Writer) error {
	e, err := readEntry(ctx, kv, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("%s: not sealed (state missing)", arg)
	}
	if err != nil {
		return err
	}
	if e.Problem != "" {
		return fmt.Errorf("%s: not sealed (state missing): its %d revision(s) are tampering, none a sealed value or frozen plan: %s", arg, len(e.Ignored), e.Problem)
	}
	var v any = e.Cell
	state := "sealed"
	if e.Campaign != nil {
		v, state = e.Campaign, "campaign"
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(map[string]any{"key": e.Key, "state": state, "revision": e.Revision, "created": e.Created, "value": v,
		"ignored_revisions": e.Ignored})
}
