package replay

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/klauspost/compress/gzip"

	"github.com/fpmbus/fpmbus/schemas"
)

// FuzzScanSegment: whatever the bytes, the segment reader never panics; what it delivers before a
// damage is exactly what the good part alone delivers (so the reported offset is where the good part
// ends); without damage, it delivers every decompressed line.
func FuzzScanSegment(f *testing.F) {
	l := line{producer: "p", observed: t0, fpm: fpmJSON(f, "p", 0, 1)}.bytes()
	m1, m2 := gzMember(f, l, l), gzMember(f, l)
	f.Add(append(bytes.Clone(m1), m2...))
	f.Add(append(bytes.Clone(m1), m2[:len(m2)/2]...))
	f.Add(gzMember(f, l[:20]))
	f.Add([]byte{})
	f.Add([]byte{0x1f, 0x8b})
	defer func(v int) { maxMemberBytes = v }(maxMemberBytes)
	maxMemberBytes = 1 << 20
	f.Fuzz(func(t *testing.T, data []byte) {
		var lines [][]byte
		d, err := scanSegment("seg", data, func(l []byte) error {
			lines = append(lines, bytes.Clone(l))
			return nil
		})
		if err != nil {
			t.Fatalf("no callback error, got %v", err)
		}
		if d != nil {
			if d.File != "seg" || d.Offset < 0 || d.Offset > int64(len(data)) {
				t.Fatalf("damage %+v of %d bytes", d, len(data))
			}
			var again [][]byte
			d2, _ := scanSegment("seg", data[:d.Offset], func(l []byte) error {
				again = append(again, bytes.Clone(l))
				return nil
			})
			if d2 != nil || len(again) != len(lines) {
				t.Fatalf("the good part (%d bytes) gives %d lines and damage %+v; the whole gave %d", d.Offset, len(again), d2, len(lines))
			}
			return
		}
		if len(data) == 0 {
			return
		}
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("undamaged but not gzip: %v", err)
		}
		all, err := io.ReadAll(zr)
		if err != nil {
			t.Fatalf("undamaged but unreadable: %v", err)
		}
		var joined []byte
		for _, l := range lines {
			joined = append(append(joined, l...), '\n')
		}
		if !bytes.Equal(joined, all) {
			t.Fatalf("lines %q, content %q", joined, all)
		}
	})
}

// FuzzRecordPayload: a line the trace schema accepts becomes a record whose payload decodes back to its
// fpm byte for byte (a recording's unsigned positive exponents coming back with their '+'), with worker_id mapped and counter_id renumbered when asked and nothing else
// changed; or it is refused with errUnencodable or errNotCanonical. Nothing panics.
func FuzzRecordPayload(f *testing.F) {
	f.Add(line{producer: "p", observed: t0, fpm: fpmJSON(f, "p", 2, 77)}.bytes())
	f.Add(line{producer: "p", mode: schemas.CaptureSampled, observed: 1, fpm: canonicalOf(f, fpmObj("é\t\"", 1, "0", `"x":[{"y":null},-0.0,1e300,-7,"\u0001"]`))}.bytes())
	f.Add(line{producer: "", observed: 0, fpm: []byte(fpmObj("w", 1, "1E5", `"big":123456789012345678901234567890`))}.bytes())
	f.Add([]byte(`{"timestamp":1,"event":{"schema":"dynamo.fpm.trace.v1"}}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rec := &Recording{}
		lr := newLineReader(rec)
		lr.file = "fuzz"
		r, err := lr.record(data)
		if err != nil {
			if !errors.Is(err, errNotTrace) && !errors.Is(err, schemas.ErrInvalidTraceLine) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		var dec schemas.Decoder
		p, err := encodePayload(nil, r.FPM, "", &dec)
		if err != nil {
			if !errors.Is(err, errUnencodable) && !errors.Is(err, errNotCanonical) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		g, err := schemas.DecodeFPM(p.build(nil, false, 0))
		// Byte for byte, but for the '+' today's writer puts in a positive exponent that a recording
		// from before zmij lacks.
		if err != nil || !bytes.Equal(g.JSON, r.FPM) && !sameButExponentSigns(g.JSON, r.FPM) {
			t.Fatalf("decodes to %s (%v), want %s", g.JSON, err, r.FPM)
		}
		q, err := encodePayload(nil, r.FPM, "mapped", &dec)
		if err != nil {
			t.Fatalf("mapped: %v", err)
		}
		h, err := schemas.DecodeFPM(q.build(nil, true, 1<<33))
		if err != nil || h.WorkerID != "mapped" || h.CounterID != 1<<33 || h.DPRank != r.DPRank || h.WallTime != g.WallTime ||
			h.Scheduled != g.Scheduled || h.Queued != g.Queued {
			t.Fatalf("rewritten: %+v (%v), recorded %+v", h, err, g)
		}
	})
}
