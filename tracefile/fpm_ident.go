package tracefile

import (
	"strconv"

	"github.com/fpmbus/fpmbus/schemas"
)

// The writer needs three values from an FPM body — worker_id, dp_rank, counter_id — and the verdict
// of schemas.ParseFPMJSON on it. Parsing every body into a tree for that is the writer's largest cost
// per message, while almost every body is the bridge's canonical JSON of a Dynamo FPM: the same fields
// in the same order, plain numbers, an ASCII worker_id. checkFPM recognises exactly that shape with one
// pass over the bytes and accepts it; anything else (other field order, unknown fields, whitespace,
// escapes, non-ASCII, negative numbers, an integer part over 18 digits, an exponent beyond ±280) goes
// to schemas.ParseFPMJSON. The
// fast path only ever accepts, so the validation is schemas' own: every body it accepts is one that
// ParseFPMJSON accepts with the same three values (every field present, version 1, a string
// worker_id, integers >= 0 that fit an int64, finite numbers >= 0, valid UTF-8, no duplicate key).
// FuzzCheckFPM checks that against ParseFPMJSON.

// fpmIdent is what the writer (and Verify) keeps of a valid FPM body.
type fpmIdent struct {
	WorkerID  string
	DPRank    int64
	CounterID int64
}

// CheckFPM validates body by the rules of schemas.ParseFPMJSON and returns its identity.
func CheckFPM(body []byte) (fpmIdent, error) {
	if id, ok := fastFPM(body); ok {
		return id, nil
	}
	f, err := schemas.ParseFPMJSON(body)
	if err != nil {
		return fpmIdent{}, err
	}
	return fpmIdent{WorkerID: f.WorkerID, DPRank: f.DPRank, CounterID: f.CounterID}, nil
}

// templatePart is one piece of fpmTemplate: literal text, then a value of kind.
type templatePart struct {
	lit  string
	kind byte // 's' ASCII string, 'i' integer, 'f' number with a fraction, 0: end
}

// fpmTemplate is the canonical FPM object: literal text between the values, a value kind after each.
// It is built from schemas.FPMLayout, the one definition of the canonical field order, and reads
// {"version":1,"worker_id":"<s>","dp_rank":<i>,"counter_id":<i>,"wall_time":<f>,
// "scheduled_requests":{"num_prefill_requests":<i>,...},"queued_requests":{...}}.
var fpmTemplate = buildTemplate(schemas.FPMLayout())

// buildTemplate turns a layout into template parts: the keys, punctuation and the version go into the
// literals; a string, count or number field ends a part.
func buildTemplate(layout []schemas.FPMField) []templatePart {
	var parts []templatePart
	lit := ""
	var object func(fields []schemas.FPMField)
	object = func(fields []schemas.FPMField) {
		lit += "{"
		for i, f := range fields {
			if i > 0 {
				lit += ","
			}
			lit += strconv.Quote(f.Name) + ":"
			switch f.Kind {
			case schemas.FPMVersionField:
				lit += strconv.Itoa(schemas.FPMVersion)
			case schemas.FPMStringField:
				parts = append(parts, templatePart{lit + `"`, 's'})
				lit = `"`
			case schemas.FPMCountField:
				parts = append(parts, templatePart{lit, 'i'})
				lit = ""
			case schemas.FPMNumberField:
				parts = append(parts, templatePart{lit, 'f'})
				lit = ""
			case schemas.FPMRequestsField:
				object(f.Fields)
			}
		}
		lit += "}"
	}
	object(layout)
	return append(parts, templatePart{lit, 0})
}

// maxFastDigits keeps every integer within int64.
const maxFastDigits = 18

// fastFPM matches body against fpmTemplate; ok is false for anything else.
func fastFPM(body []byte) (id fpmIdent, ok bool) {
	p := 0
	ints := 0
	for _, t := range fpmTemplate {
		if len(body)-p < len(t.lit) || string(body[p:p+len(t.lit)]) != t.lit {
			return id, false
		}
		p += len(t.lit)
		switch t.kind {
		case 's':
			start := p
			for p < len(body) && body[p] >= 0x20 && body[p] < 0x7f && body[p] != '"' && body[p] != '\\' {
				p++
			}
			id.WorkerID = string(body[start:p])
		case 'i', 'f':
			v, n := fastUint(body[p:])
			if n == 0 {
				return id, false
			}
			p += n
			if t.kind == 'f' {
				if n = fastFraction(body[p:]); n == 0 {
					return id, false
				}
				p += n
				break
			}
			switch ints {
			case 0:
				id.DPRank = v
			case 1:
				id.CounterID = v
			}
			ints++
		}
	}
	return id, p == len(body)
}

// maxFastExponent keeps a number whose integer part has at most maxFastDigits digits finite, and
// clear of underflow, by a wide margin (float64 reaches 1.8e308 and 4.9e-324).
const maxFastExponent = 280

// fastFraction reads what follows a number's integer part as the canonical float format writes it
// (schemas/canonical_json.go): a fraction ".d+", an exponent "e±d+", or both. n is the number of bytes
// read, 0 when neither is there or the exponent is out of bounds. A fraction has as many digits as
// it has: a forward pass's wall_time of a few ms is written "0.0029710211149514445", 17 significant
// digits behind two zeros, and any number of digits after the point is a finite number.
func fastFraction(b []byte) (n int) {
	if n < len(b) && b[n] == '.' {
		n++
		start := n
		for n < len(b) && b[n] >= '0' && b[n] <= '9' {
			n++
		}
		if n == start {
			return 0
		}
	}
	if n == len(b) || b[n] != 'e' {
		return n
	}
	n++
	if n < len(b) && (b[n] == '+' || b[n] == '-') {
		n++
	}
	exp, digits := 0, 0
	for n < len(b) && b[n] >= '0' && b[n] <= '9' {
		if exp = exp*10 + int(b[n]-'0'); exp > maxFastExponent {
			return 0
		}
		n++
		digits++
	}
	if digits == 0 {
		return 0
	}
	return n
}

// fastUint reads a JSON integer without sign: "0" or [1-9][0-9]*, at most maxFastDigits digits. n is
// the number of bytes read, 0 if none fit.
func fastUint(b []byte) (v int64, n int) {
	if len(b) == 0 || b[0] < '0' || b[0] > '9' {
		return 0, 0
	}
	if b[0] == '0' {
		if len(b) > 1 && b[1] >= '0' && b[1] <= '9' {
			return 0, 0 // a leading zero is not JSON
		}
		return 0, 1
	}
	for n < len(b) && b[n] >= '0' && b[n] <= '9' {
		if n == maxFastDigits {
			return 0, 0
		}
		v = v*10 + int64(b[n]-'0')
		n++
	}
	return v, n
}
