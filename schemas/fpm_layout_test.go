package schemas

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// The canonical JSON of a decoded payload lists the fields in FPMLayout's order, each holding a value of
// the field's kind: the layout and the codec describe the same order.
func TestFPMLayoutIsTheCanonicalJSONOrder(t *testing.T) {
	f, err := DecodeFPM(goldenPayload())
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(f.JSON))
	dec.UseNumber()
	next := func() json.Token {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("canonical JSON %s: %v", f.JSON, err)
		}
		return tok
	}
	var walk func(path string, fields []FPMField)
	walk = func(path string, fields []FPMField) {
		if tok := next(); tok != json.Delim('{') {
			t.Fatalf("%s: %v, want an object", path, tok)
		}
		for _, fd := range fields {
			if key := next(); key != fd.Name {
				t.Fatalf("%s: key %v, want %q (layout order)", path, key, fd.Name)
			}
			if fd.Kind == FPMRequestsField {
				walk(path+fd.Name+".", fd.Fields)
				continue
			}
			v := next()
			n, isNum := v.(json.Number)
			_, isStr := v.(string)
			ok := map[fpmFieldKind]bool{
				FPMVersionField: isNum && n.String() == "1",
				FPMStringField:  isStr,
				FPMCountField:   isNum && !strings.ContainsAny(n.String(), ".eE"),
				FPMNumberField:  isNum && strings.Contains(n.String(), "."),
			}[fd.Kind]
			if !ok {
				t.Fatalf("%s%s: value %v does not have kind %d", path, fd.Name, v, fd.Kind)
			}
		}
		if tok := next(); tok != json.Delim('}') {
			t.Fatalf("%s: %v after the layout's fields, want the end of the object", path, tok)
		}
	}
	walk("", FPMLayout())
}

func TestFPMLayoutIsACopy(t *testing.T) {
	a := FPMLayout()
	a[0].Name = "changed"
	a[5].Fields[0].Name = "changed"
	if b := FPMLayout(); b[0].Name != "version" || b[5].Fields[0].Name != "num_prefill_requests" {
		t.Fatalf("FPMLayout shares its state with callers: %+v", b)
	}
}
