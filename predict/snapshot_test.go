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

// Apply folds a key's history as the sealer does (schemas.KeyHistory): a delete marker and junk stored
// under a cell key before its seal make it an unusable cell (every query refused as corrupt) and are
// listed as ignored; the seal that follows them is the cell, and answers. A campaign record stored
// before its frozen plan, even a complete one, is no record: require_complete refuses until the plan
// and its successors come.
func TestSnapshotTakesTheFirstSealAfterJunk(t *testing.T) {
	us := readFixture(t, fixturePath)
	fixtureEntries(t)
	var seal, plan, complete Update
	for _, u := range us {
		switch {
		case u.Key == keyA:
			seal = u
		case u.Key == "campaign.camp-complete" && plan.Key == "":
			plan = u
		case u.Key == "campaign.camp-complete":
			complete = u
		}
	}
	q := Query{Key: keyA, Step: prefillStep(1, 128, 0)}
	poisoned := (*Snapshot)(nil).Apply(Update{Key: keyA, Revision: 1, Deleted: true}, Update{Key: keyA, Revision: 2, Value: []byte(`{"forged":true}`)},
		Update{Key: plan.Key, Revision: 3, Value: complete.Value})
	if a := poisoned.Predict(q, Options{}); a.Refusal == nil || a.Refusal.Reason != reasonCorruptCell {
		t.Fatalf("before the seal: %+v, want the cell refused as corrupt", a)
	}
	if len(poisoned.Ignored()) != 3 {
		t.Fatalf("ignored %+v, want the delete marker, the junk and the campaign record before its plan", poisoned.Ignored())
	}
	seal.Revision, plan.Revision, complete.Revision = 4, 5, 6
	sealed := poisoned.Apply(seal)
	a := sealed.Predict(q, Options{})
	if a.Status != StatusMeasured || a.Cell == nil || a.Cell.Revision != 4 {
		t.Fatalf("after the seal: %+v, want the sealed cell of revision 4", a)
	}
	if r := sealed.Predict(q, Options{RequireComplete: true}).Refusal; r == nil || r.Reason != ReasonIncompleteCampaign || r.Campaign.State != "unreadable" {
		t.Fatalf("a complete record stored before the plan counted: %+v", r)
	}
	done := sealed.Apply(plan, complete)
	if a := done.Predict(q, Options{RequireComplete: true}); a.Status != StatusMeasured {
		t.Fatalf("after the plan and its successor: %+v", a)
	}
	if len(done.Ignored()) != 0 || done.Cell(keyA).Revision != 4 {
		t.Fatalf("ignored %+v, cell %+v", done.Ignored(), done.Cell(keyA))
	}
}
