package streams

import (
	"errors"
	"testing"
)

func TestEncodeToken(t *testing.T) {
	tests := map[string]struct{ in, want string }{
		"plain kept":            {"backend-1_a", "backend-1_a"},
		"dot escaped":           {"a.b", "a%2Eb"},
		"wildcards escaped":     {"*>", "%2A%3E"},
		"space and slash":       {"worker/a b", "worker%2Fa%20b"},
		"percent escaped":       {"50%", "50%25"},
		"utf8 bytes":            {"é", "%C3%A9"},
		"empty is lone percent": {"", "%"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := EncodeToken(tc.in)
			if got != tc.want {
				t.Fatalf("EncodeToken(%q) = %q, want %q", tc.in, got, tc.want)
			}
			back, err := decodeToken(got)
			if err != nil || back != tc.in {
				t.Fatalf("DecodeToken(%q) = %q, %v; want %q", got, back, err, tc.in)
			}
		})
	}
}

func TestParseFPMSubject(t *testing.T) {
	k := Key{Namespace: "dyn.amo", Component: "backend", WorkerID: "", DPRank: 3}
	subj := FPMSubject(k)
	if subj != "fpm.dyn%2Eamo.backend.%.3" {
		t.Fatalf("FPMSubject = %q", subj)
	}
	got, err := ParseFPMSubject(subj)
	if err != nil || got != k {
		t.Fatalf("ParseFPMSubject(%q) = %+v, %v; want %+v", subj, got, err, k)
	}
	bad := map[string]string{
		"wrong root":     "fpmevents.drop.a.b.c.1",
		"too few tokens": "fpm.a.b.1",
		"rank not int":   "fpm.a.b.c.x",
		"negative rank":  "fpm.a.b.c.-1",
		"bad escape":     "fpm.a%G1.b.c.1",
	}
	for name, s := range bad {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseFPMSubject(s); !errors.Is(err, ErrBadSubject) {
				t.Fatalf("ParseFPMSubject(%q) err = %v, want ErrBadSubject", s, err)
			}
		})
	}
	dk, err := ParseKeySubject(DropMarkerSubject(k), eventsRoot+".drop")
	if err != nil || dk != k {
		t.Fatalf("drop marker subject round trip: %+v %v", dk, err)
	}
}

// TestKeyForms checks the other places a Key or a consumer stands in: a KV key (and back), a drop-marker
// filter derived from an FPM filter, a consumer's loss subject.
func TestKeyForms(t *testing.T) {
	t.Parallel()
	k := Key{Namespace: "dyn.amo", Component: "back end", WorkerID: "", DPRank: 3}
	kv := KVKeyTokens(k)
	if kv != "dyn=2Eamo.back=20end.=.3" {
		t.Fatalf("KVKeyTokens = %q", kv)
	}
	if got, err := ParseKVKeyTokens(kv); err != nil || got != k {
		t.Fatalf("ParseKVKeyTokens(%q) = %+v, %v; want %+v", kv, got, err, k)
	}
	if _, err := ParseKVKeyTokens("a.b.c"); !errors.Is(err, ErrBadSubject) {
		t.Fatalf("ParseKVKeyTokens of three tokens: err = %v, want ErrBadSubject", err)
	}
	filters := map[string]string{
		FPMWildcard:            DropMarkerWildcard,
		"fpm.dynamo.backend.>": "fpmevents.drop.dynamo.backend.>",
		"fpm.*.*.w1.*":         "fpmevents.drop.*.*.w1.*",
		FPMSubject(k):          DropMarkerSubject(k),
	}
	for fpm, want := range filters {
		if got := DropMarkerFilter(fpm); got != want {
			t.Errorf("DropMarkerFilter(%q) = %q, want %q", fpm, got, want)
		}
	}
	if got := ConsumerLossSubject("trace"); got != "fpmevents.loss.trace" {
		t.Fatalf("ConsumerLossSubject = %q", got)
	}
}

func TestMsgIDDistinguishesEpochs(t *testing.T) {
	k := Key{Namespace: "dynamo", Component: "backend", WorkerID: "w", DPRank: 0}
	if MsgID(k, 1, 0) == MsgID(k, 2, 0) {
		t.Fatal("same sequence in two publisher runs must give different ids")
	}
	if MsgID(k, 1, 7) != MsgID(k, 1, 7) {
		t.Fatal("MsgID must be stable for the same message")
	}
}
