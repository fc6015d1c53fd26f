package schemas

// TEMPORARY STUBS — the schemas helper replaces this file with real implementations.

// DecodeFPM decodes a msgpack ForwardPassMetrics payload and validates it.
// Errors wrap ErrMalformed (not msgpack / not a map) or ErrInvalid (validation), and name the field.
func DecodeFPM(payload []byte) (*FPM, error) { panic("schemas.DecodeFPM: not implemented yet") }

// ParseFPMJSON parses a canonical JSON FPM body (as stored on the FPM stream) and validates it.
func ParseFPMJSON(body []byte) (*FPM, error) { panic("schemas.ParseFPMJSON: not implemented yet") }

// EncodeMsgpack encodes f exactly as msgspec.msgpack.Encoder encodes Dynamo's struct.
func EncodeMsgpack(f *FPM) []byte { panic("schemas.EncodeMsgpack: not implemented yet") }
