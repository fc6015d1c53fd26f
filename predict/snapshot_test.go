package predict

import "testing"

// Snapshot.Apply is the cache keyed by KV revision: a replayed entry (same key, same revision) keeps
// its loaded cell; a later revision of a cell (an overwrite, a delete marker) is ignored, and listed
// as such, since a sealed cell is its key's first revision; the snapshot applied to is never changed.
func TestSnapshotCachesByRevision(t *testing.T) {
	us := readFixture(t, fixturePath)
	fixtureEntries(t)
	s1 := (*Snapshot)(nil).Apply(us...)
	a1 := s1.Cell(keyA)
	if a1 == nil || !a1.Valid() || s1.Revision() != uint64(len(us)) || len(s1.Cells()) != 4 || s1.Campaign("camp-partial") == nil {
		t.Fatalf("loaded %+v revision %d", a1, s1.Revision())
	}
	replay := s1.Apply(us...) // a re-watch after a reconnect delivers every key again
	if replay.Cell(keyA) != a1 || replay.Campaign("camp-complete") != s1.Campaign("camp-complete") {
		t.Fatal("a replayed revision was loaded again")
	}
	newer := s1.Apply(Update{Key: keyA, Revision: 42, Value: us[0].Value})
	if c := newer.Cell(keyA); c != a1 || newer.Revision() != 42 || len(newer.Ignored()) != 1 || newer.Ignored()[0].Revision != 42 {
		t.Fatalf("a later revision replaced the sealed cell: %+v (ignored %+v)", c, newer.Ignored())
	}
	gone := newer.Apply(Update{Key: keyA, Revision: 43, Deleted: true}, Update{Key: "other.key", Revision: 44, Value: []byte("x")})
	if gone.Cell(keyA) != a1 || gone.Revision() != 44 || len(gone.Cells()) != 4 || len(gone.Ignored()) != 1 {
		t.Fatalf("after a delete marker: %v cells, revision %d, ignored %+v", len(gone.Cells()), gone.Revision(), gone.Ignored())
	}
	if s1.Cell(keyA) != a1 || s1.Revision() != uint64(len(us)) || newer.Cell(keyA) == nil {
		t.Fatal("Apply changed the snapshot it was applied to")
	}
	var empty *Snapshot
	if empty.Cell(keyA) != nil || empty.Revision() != 0 || len(empty.Cells()) != 0 {
		t.Fatal("the nil snapshot is not the empty bucket")
	}
	if a := empty.Predict(Query{Key: keyA, Step: prefillStep(1, 128, 0)}, Options{}); a.Refusal == nil || a.Refusal.Reason != ReasonUnknownIdentity {
		t.Fatalf("%+v", a)
	}
}
