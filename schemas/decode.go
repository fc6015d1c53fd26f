package schemas

// DecodeFPM decodes a msgpack ForwardPassMetrics payload (as Dynamo's publisher sends it on ZMQ),
// validates it (validate.go) and returns the typed FPM with its canonical JSON (canonical_json.go).
//
// Errors: a *decodeError wrapping errMalformed when payload is not one well-formed msgpack map, or a
// *validationError wrapping ErrInvalid when the map breaks an FPM rule; both name the field. payload is
// not retained: the returned FPM shares no memory with it.
//
// The common shape is decoded in one pass (fastpath.go); anything else by the general tree path. Hot
// loops should use a Decoder (one per goroutine) or appendDecodeFPM, which allocate less.
func DecodeFPM(payload []byte) (*FPM, error) { return decodePooled(payload, false) }

// ParseFPMJSON parses a canonical JSON FPM body (as stored on the FPM stream, or nested under "fpm" in a
// trace line) and validates it by the same rules as DecodeFPM. Integer literals stay integers: 1.0 is not
// a valid count. The returned FPM's JSON field is body itself, not a copy (callers that reuse body must
// copy it first).
//
// Errors: a *decodeError (Format "json") wrapping errMalformed when body is not one JSON object (syntax,
// duplicate keys, invalid UTF-8, nesting deeper than 32), or a *validationError wrapping ErrInvalid.
//
// The compact form is read in one pass (fastpath.go); anything else by the general tree path. Hot loops
// should use Decoder.ParseFPMJSON, which allocates nothing for the compact form.
func ParseFPMJSON(body []byte) (*FPM, error) { return decodePooled(body, true) }

// decodePooled decodes in, a JSON body (json) or a msgpack payload, with a pooled Decoder and returns
// a new FPM holding the result. The FPM is allocated only once the decode succeeded: until then it
// lives on the stack (the Decoder methods are called directly for that, not through a func value).
func decodePooled(in []byte, json bool) (*FPM, error) {
	d := getFastDecoder()
	var f FPM
	var err error
	if json {
		err = d.ParseFPMJSON(in, &f)
	} else {
		err = d.DecodeFPM(in, &f)
	}
	putFastDecoder(d)
	if err != nil {
		return nil, err
	}
	out := new(FPM)
	*out = f
	return out, nil
}
