package schemas

// DecodeFPM decodes a msgpack ForwardPassMetrics payload (as Dynamo's publisher sends it on ZMQ),
// validates it (validate.go) and returns the typed FPM with its canonical JSON (canonical_json.go).
//
// Errors: a *DecodeError wrapping ErrMalformed when payload is not one well-formed msgpack map, or a
// *ValidationError wrapping ErrInvalid when the map breaks an FPM rule; both name the field. payload is
// not retained: the returned FPM shares no memory with it.
func DecodeFPM(payload []byte) (*FPM, error) {
	d := getDecoder(payload)
	defer putDecoder(d)
	if err := d.parseMsgpack(); err != nil {
		return nil, err
	}
	f := new(FPM)
	if err := validateFPM(&d.tree, 0, f); err != nil {
		return nil, err
	}
	d.out, _ = appendCanonical(d.out[:0], &d.tree, 0)
	f.JSON = append(make([]byte, 0, len(d.out)), d.out...)
	return f, nil
}

// ParseFPMJSON parses a canonical JSON FPM body (as stored on the FPM stream, or nested under "fpm" in a
// trace line) and validates it by the same rules as DecodeFPM. Integer literals stay integers: 1.0 is not
// a valid count. The returned FPM's JSON field is body itself, not a copy (callers that reuse body must
// copy it first).
//
// Errors: a *DecodeError (Format "json") wrapping ErrMalformed when body is not one JSON object (syntax,
// duplicate keys, invalid UTF-8, nesting deeper than 32), or a *ValidationError wrapping ErrInvalid.
func ParseFPMJSON(body []byte) (*FPM, error) {
	d := getDecoder(body)
	defer putDecoder(d)
	if err := d.parseJSON(); err != nil {
		return nil, err
	}
	f := new(FPM)
	if err := validateFPM(&d.tree, 0, f); err != nil {
		return nil, err
	}
	f.JSON = body
	return f, nil
}
