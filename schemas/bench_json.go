package schemas

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// Self-benchmark artefacts are read into an ordered JSON tree (BenchNode) rather than into Go structs, so
// that a merge keeps every field of every rank file — unknown ones too — in the order the producer wrote
// it, and numbers exactly as written (a timing of 0.062000000000000006 stays that text). The typed views
// in bench.go describe the fields the merge rules read; the tree is what a merge copies.

// benchKind is the JSON type of a BenchNode.
type benchKind uint8

// The JSON types.
const (
	BenchNull benchKind = iota
	BenchBool
	BenchNumber
	BenchString
	BenchArray
	BenchObject
)

func (k benchKind) String() string {
	switch k {
	case BenchNull:
		return "null"
	case BenchBool:
		return "bool"
	case BenchNumber:
		return "number"
	case BenchString:
		return "string"
	case BenchArray:
		return "array"
	case BenchObject:
		return "object"
	}
	return "unknown"
}

// BenchNode is one value of an ordered JSON document.
//
//   - BenchString: Str is the decoded string.
//   - BenchNumber: Str is the number literal exactly as the document wrote it (valid JSON grammar).
//   - BenchBool: Str is "true" or "false".
//   - BenchArray: Kids are the elements.
//   - BenchObject: Keys are the member names in document order (unique) and Kids[i] is the value of Keys[i].
//
// A container read by parseBenchHeader below the depth it builds is "raw": no Kids, and Str holds its JSON
// text (see Raw). Children are stored by value, one allocation per container, so a tree of a 60 MB
// artefact costs a few hundred MB rather than a few GB. The zero value is null.
type BenchNode struct {
	Kind benchKind
	Str  string
	Keys []string
	Kids []BenchNode
}

// benchMaxDepth is the deepest container nesting ParseBenchJSON accepts (the top-level value is depth 1).
const benchMaxDepth = 512

// errBenchMalformed: the bytes are not one well-formed JSON document acceptable as a benchmark artefact
// (syntax error, invalid UTF-8, a raw control character in a string, an unpaired surrogate escape, a
// duplicate object key, nesting deeper than benchMaxDepth, or trailing data). Returned as a
// *benchSyntaxError.
var errBenchMalformed = errors.New("schemas: malformed benchmark JSON")

// benchSyntaxError reports where a benchmark document is malformed. It matches errBenchMalformed.
type benchSyntaxError struct {
	Offset int    // byte offset of the problem
	Reason string // what is wrong there
}

func (e *benchSyntaxError) Error() string {
	return "schemas: malformed benchmark JSON at byte " + strconv.Itoa(e.Offset) + ": " + e.Reason
}

// Is reports whether target is errBenchMalformed.
func (e *benchSyntaxError) Is(target error) bool { return target == errBenchMalformed }

// ParseBenchJSON parses one JSON document into an ordered tree. It copies data once; the tree does not
// alias data afterwards.
func ParseBenchJSON(data []byte) (*BenchNode, error) {
	p := newBenchParser(bytes.Clone(data))
	return p.document()
}

// parseBenchHeader parses a rank or merged artefact like ParseBenchJSON, except that the elements of the
// top-level "results" and "iteration_groups" arrays are only checked for syntax and kept raw (Str holds
// their JSON text, see Raw). It is how a merger reads the run-level fields of every rank before it
// builds the large parts of one rank at a time. Duplicate keys inside a raw element are not detected
// here (ParseBenchJSON detects them).
func parseBenchHeader(data []byte) (*BenchNode, error) {
	p := newBenchParser(bytes.Clone(data))
	p.header = true
	return p.document()
}

// newBenchParser reads b, which it aliases: strings of the trees it builds point into b, so b must not
// change while they are in use.
func newBenchParser(b []byte) *benchParser {
	p := &benchParser{b: b}
	if len(b) > 0 {
		p.src = unsafe.String(&b[0], len(b))
	}
	return p
}

type benchParser struct {
	src    string // the document; shares memory with b
	b      []byte
	pos    int
	depth  int
	header bool
	stack  []BenchNode // children of the containers being parsed
	keys   []string    // keys of the objects being parsed
}

func (p *benchParser) fail(off int, reason string) error {
	return &benchSyntaxError{Offset: off, Reason: reason}
}

func (p *benchParser) document() (*BenchNode, error) {
	if strings.HasPrefix(p.src, "\xef\xbb\xbf") {
		return nil, p.fail(0, "byte order mark")
	}
	p.ws()
	n, err := p.value(p.header)
	if err != nil {
		return nil, err
	}
	p.ws()
	if p.pos != len(p.src) {
		return nil, p.fail(p.pos, "data after the top-level value")
	}
	return &n, nil
}

func (p *benchParser) ws() {
	b, i := p.b, p.pos
	for i < len(b) {
		switch b[i] {
		case ' ':
			// Indented documents are mostly runs of spaces: skip them eight at a time.
			for i+8 <= len(b) && binary.LittleEndian.Uint64(b[i:]) == 0x2020202020202020 {
				i += 8
			}
			for i < len(b) && b[i] == ' ' {
				i++
			}
		case '\t', '\n', '\r':
			i++
		default:
			p.pos = i
			return
		}
	}
	p.pos = i
}

// value parses the value at p.pos. top marks the top-level value of parseBenchHeader.
func (p *benchParser) value(top bool) (BenchNode, error) {
	if p.pos >= len(p.src) {
		return BenchNode{}, p.fail(p.pos, "unexpected end of input")
	}
	switch c := p.src[p.pos]; {
	case c == '{':
		return p.object(top)
	case c == '[':
		return p.array(false)
	case c == '"':
		s, err := p.string()
		return BenchNode{Kind: BenchString, Str: s}, err
	case c == 't':
		return p.literal("true", BenchBool)
	case c == 'f':
		return p.literal("false", BenchBool)
	case c == 'n':
		return p.literal("null", BenchNull)
	case c == '-' || c >= '0' && c <= '9':
		s, err := p.number()
		return BenchNode{Kind: BenchNumber, Str: s}, err
	}
	return BenchNode{}, p.fail(p.pos, "unexpected character "+strconv.QuoteRune(rune(p.src[p.pos])))
}

func (p *benchParser) literal(word string, k benchKind) (BenchNode, error) {
	if !strings.HasPrefix(p.src[p.pos:], word) {
		return BenchNode{}, p.fail(p.pos, "invalid literal")
	}
	p.pos += len(word)
	n := BenchNode{Kind: k}
	if k == BenchBool {
		n.Str = word
	}
	return n, nil
}

func (p *benchParser) enter() error {
	p.depth++
	if p.depth > benchMaxDepth {
		return p.fail(p.pos, "nesting deeper than "+strconv.Itoa(benchMaxDepth))
	}
	return nil
}

// keyIndex is the index of key k among keys (-1: absent), looking at hint first: the members of two
// documents that are alike usually come in the same order.
func keyIndex(keys []string, hint int, k string) int {
	if hint < len(keys) && keys[hint] == k {
		return hint
	}
	for j, key := range keys {
		if key == k {
			return j
		}
	}
	return -1
}

// open enters the container whose opening byte is at p.pos and moves past that byte; empty: closing
// follows at once, and the container is left again (consumed, depth restored).
func (p *benchParser) open(closing byte) (empty bool, err error) {
	if err := p.enter(); err != nil {
		return false, err
	}
	p.pos++
	p.ws()
	if p.pos < len(p.src) && p.src[p.pos] == closing {
		p.pos++
		p.depth--
		return true, nil
	}
	return false, nil
}

// memberKey reads an object member's key and the ':' after it, and returns the key and its offset.
func (p *benchParser) memberKey() (key string, off int, err error) {
	p.ws()
	if p.pos >= len(p.src) || p.src[p.pos] != '"' {
		return "", p.pos, p.fail(p.pos, "expected a string key")
	}
	off = p.pos
	if key, err = p.string(); err != nil {
		return "", off, err
	}
	p.ws()
	if p.pos >= len(p.src) || p.src[p.pos] != ':' {
		return "", off, p.fail(p.pos, "expected ':' after key")
	}
	p.pos++
	return key, off, nil
}

// next moves past what follows a member or element of the container closing ends: a ',' (more
// follow) or closing itself (end: the container is left, depth restored). eof and unexpected are the
// messages of the errors when the input ends there or something else follows.
func (p *benchParser) next(closing byte, eof, unexpected string) (end bool, err error) {
	p.ws()
	if p.pos >= len(p.src) {
		return false, p.fail(p.pos, eof)
	}
	switch p.src[p.pos] {
	case ',':
		p.pos++
		return false, nil
	case closing:
		p.pos++
		p.depth--
		return true, nil
	}
	return false, p.fail(p.pos, unexpected)
}

func (p *benchParser) object(top bool) (BenchNode, error) {
	base, kbase := len(p.stack), len(p.keys)
	empty, err := p.open('}')
	if err != nil {
		return BenchNode{}, err
	}
	if empty {
		return BenchNode{Kind: BenchObject}, nil
	}
	for {
		key, keyOff, err := p.memberKey()
		if err != nil {
			return BenchNode{}, err
		}
		p.ws()
		var v BenchNode
		if top && (key == "results" || key == "iteration_groups") && p.pos < len(p.src) && p.src[p.pos] == '[' {
			v, err = p.array(true)
		} else {
			v, err = p.value(false)
		}
		if err != nil {
			return BenchNode{}, err
		}
		if len(p.keys)-kbase < 32 { // larger objects are checked with a set below
			for _, k := range p.keys[kbase:] {
				if k == key {
					return BenchNode{}, p.fail(keyOff, "duplicate key "+strconv.Quote(key))
				}
			}
		}
		p.keys = append(p.keys, key)
		p.stack = append(p.stack, v)
		end, err := p.next('}', "unexpected end of input in object", "expected ',' or '}' in object")
		if err != nil {
			return BenchNode{}, err
		}
		if end {
			break
		}
	}
	n := BenchNode{Kind: BenchObject}
	n.Keys = append([]string(nil), p.keys[kbase:]...)
	n.Kids = append([]BenchNode(nil), p.stack[base:]...)
	clear(p.stack[base:])
	p.stack = p.stack[:base]
	p.keys = p.keys[:kbase]
	if len(n.Keys) > 32 {
		seen := make(map[string]struct{}, len(n.Keys))
		for _, k := range n.Keys {
			if _, dup := seen[k]; dup {
				return BenchNode{}, p.fail(p.pos-1, "duplicate key "+strconv.Quote(k))
			}
			seen[k] = struct{}{}
		}
	}
	return n, nil
}

// array parses an array; rawElems keeps container elements raw (parseBenchHeader).
func (p *benchParser) array(rawElems bool) (BenchNode, error) {
	base := len(p.stack)
	empty, err := p.open(']')
	if err != nil {
		return BenchNode{}, err
	}
	if empty {
		return BenchNode{Kind: BenchArray}, nil
	}
	for {
		p.ws()
		var v BenchNode
		var err error
		if rawElems && p.pos < len(p.src) && (p.src[p.pos] == '{' || p.src[p.pos] == '[') {
			v, err = p.raw()
		} else {
			v, err = p.value(false)
		}
		if err != nil {
			return BenchNode{}, err
		}
		p.stack = append(p.stack, v)
		end, err := p.next(']', "unexpected end of input in array", "expected ',' or ']' in array")
		if err != nil {
			return BenchNode{}, err
		}
		if end {
			break
		}
	}
	n := BenchNode{Kind: BenchArray, Kids: append([]BenchNode(nil), p.stack[base:]...)}
	clear(p.stack[base:])
	p.stack = p.stack[:base]
	return n, nil
}

// raw checks the syntax of the container at p.pos without building it and returns it as a raw node.
func (p *benchParser) raw() (BenchNode, error) {
	start := p.pos
	k := BenchArray
	if p.src[p.pos] == '{' {
		k = BenchObject
	}
	if err := p.skip(); err != nil {
		return BenchNode{}, err
	}
	return BenchNode{Kind: k, Str: p.src[start:p.pos]}, nil
}

// skip checks the syntax of one value and moves past it.
func (p *benchParser) skip() error {
	if p.pos >= len(p.src) {
		return p.fail(p.pos, "unexpected end of input")
	}
	switch c := p.src[p.pos]; c {
	case '{', '[':
		closing := byte('}')
		if c == '[' {
			closing = ']'
		}
		if empty, err := p.open(closing); empty || err != nil {
			return err
		}
		for {
			if c == '{' {
				if _, _, err := p.memberKey(); err != nil {
					return err
				}
			}
			p.ws()
			if err := p.skip(); err != nil {
				return err
			}
			end, err := p.next(closing, "unexpected end of input in container", "expected ',' or "+strconv.Quote(string(closing)))
			if err != nil {
				return err
			}
			if end {
				return nil
			}
		}
	}
	_, err := p.value(false)
	return err
}

// benchStrSpecial marks the bytes the string scanner must look at: '"', '\\', control characters, and
// non-ASCII bytes (1, so a string made of plain ASCII skips UTF-8 validation).
var benchStrSpecial = func() (t [256]uint8) {
	for c := range 0x20 {
		t[c] = 2
	}
	t['"'], t['\\'] = 2, 2
	for c := 0x80; c < 256; c++ {
		t[c] = 1
	}
	return t
}()

func (p *benchParser) string() (string, error) {
	start := p.pos + 1
	b := p.b
	i := start
	ascii := true
	for i < len(b) {
		c := b[i]
		switch benchStrSpecial[c] {
		case 0:
			i++
			continue
		case 1:
			ascii = false
			i++
			continue
		}
		if c == '"' {
			s := p.src[start:i]
			if !ascii && !utf8.ValidString(s) {
				return "", p.fail(start, "invalid UTF-8 in string")
			}
			p.pos = i + 1
			return s, nil
		}
		if c == '\\' {
			return p.escapedString(start, i)
		}
		return "", p.fail(i, "control character in string")
	}
	return "", p.fail(p.pos, "unterminated string")
}

// skipUnchecked moves past the value at p.pos finding only its end: strings are scanned for their
// closing quote and everything else for matching brackets, without validating the syntax in between.
func (p *benchParser) skipUnchecked() error {
	b := p.b
	i := p.pos
	if i >= len(b) {
		return p.fail(i, "unexpected end of input")
	}
	if c := b[i]; c != '{' && c != '[' && c != '"' {
		for i < len(b) {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				p.pos = i
				return nil
			}
			i++
		}
		p.pos = i
		return nil
	}
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			i++
			for i < len(b) && b[i] != '"' {
				if b[i] == '\\' {
					i++
				}
				i++
			}
			if i >= len(b) {
				return p.fail(p.pos, "unterminated string")
			}
			if depth == 0 {
				p.pos = i + 1
				return nil
			}
		case '{', '[':
			depth++
			if depth > benchMaxDepth {
				return p.fail(i, "nesting deeper than "+strconv.Itoa(benchMaxDepth))
			}
		case '}', ']':
			depth--
			if depth == 0 {
				p.pos = i + 1
				return nil
			}
		}
		i++
	}
	return p.fail(p.pos, "unterminated container")
}

func (p *benchParser) escapedString(start, i int) (string, error) {
	b := make([]byte, 0, i-start+16)
	b = append(b, p.src[start:i]...)
	for i < len(p.src) {
		c := p.src[i]
		switch {
		case c == '"':
			if !utf8.Valid(b) {
				return "", p.fail(start, "invalid UTF-8 in string")
			}
			p.pos = i + 1
			return string(b), nil
		case c < 0x20:
			return "", p.fail(i, "control character in string")
		case c != '\\':
			b = append(b, c)
			i++
			continue
		}
		if i+1 >= len(p.src) {
			break
		}
		switch e := p.src[i+1]; e {
		case '"', '\\', '/':
			b = append(b, e)
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r, ok := jsonHex4(p.src, i+2)
			if !ok {
				return "", p.fail(i, "invalid \\u escape")
			}
			i += 6
			if utf16.IsSurrogate(r) {
				r2, ok := rune(0), false
				if r < 0xdc00 && i+1 < len(p.src) && p.src[i] == '\\' && p.src[i+1] == 'u' {
					r2, ok = jsonHex4(p.src, i+2)
				}
				dec := utf16.DecodeRune(r, r2)
				if !ok || dec == utf8.RuneError {
					return "", p.fail(i-6, "unpaired surrogate escape")
				}
				r = dec
				i += 6
			}
			b = utf8.AppendRune(b, r)
			continue
		default:
			return "", p.fail(i, "invalid escape \\"+string(rune(e)))
		}
		i += 2
	}
	return "", p.fail(p.pos, "unterminated string")
}

// benchNumberFaults are the benchmark reader's messages for a number that breaks the grammar.
var benchNumberFaults = [...]string{
	numberNoInteger:  "invalid number",
	numberNoFraction: "invalid number: no digits after '.'",
	numberNoExponent: "invalid number: no digits in exponent",
}

func (p *benchParser) number() (string, error) {
	end, _, _, fault := scanJSONNumber(p.src, p.pos)
	if fault != numberOK {
		return "", p.fail(end, benchNumberFaults[fault])
	}
	start := p.pos
	p.pos = end
	return p.src[start:end], nil
}

// --- accessors ---

// Raw reports whether n is a container kept as unparsed text by parseBenchHeader; its text is n.Str.
func (n *BenchNode) Raw() bool {
	return n != nil && (n.Kind == BenchArray || n.Kind == BenchObject) && n.Str != ""
}

// Get returns the value of member key of object n, or nil when n is not an object or has no such key.
func (n *BenchNode) Get(key string) *BenchNode {
	if n == nil || n.Kind != BenchObject {
		return nil
	}
	for i, k := range n.Keys {
		if k == key {
			return &n.Kids[i]
		}
	}
	return nil
}

// Has reports whether object n has member key (a null value counts).
func (n *BenchNode) Has(key string) bool { return n.Get(key) != nil }

// Path follows object keys from n; nil when any step is missing or not an object.
func (n *BenchNode) Path(keys ...string) *BenchNode {
	for _, k := range keys {
		n = n.Get(k)
	}
	return n
}

// Len is the number of elements or members of a container, 0 otherwise.
func (n *BenchNode) Len() int {
	if n == nil {
		return 0
	}
	return len(n.Kids)
}

// IsNull reports whether n is missing (nil) or JSON null.
func (n *BenchNode) IsNull() bool { return n == nil || n.Kind == BenchNull }

// IsObject, IsArray and IsString report n's kind (false for nil).
func (n *BenchNode) IsObject() bool { return n != nil && n.Kind == BenchObject }
func (n *BenchNode) IsArray() bool  { return n != nil && n.Kind == BenchArray }
func (n *BenchNode) IsString() bool { return n != nil && n.Kind == BenchString }

// Text returns the string value of a string node.
func (n *BenchNode) Text() (string, bool) {
	if n == nil || n.Kind != BenchString {
		return "", false
	}
	return n.Str, true
}

// Bool returns the value of a bool node.
func (n *BenchNode) Bool() (value, ok bool) {
	if n == nil || n.Kind != BenchBool {
		return false, false
	}
	return n.Str == "true", true
}

// IsInt reports whether n is an integer literal (no fraction, no exponent), as Python's json reads an int.
func (n *BenchNode) IsInt() bool {
	return n != nil && n.Kind == BenchNumber && !strings.ContainsAny(n.Str, ".eE")
}

// Int returns the value of an integer literal that fits an int64.
func (n *BenchNode) Int() (int64, bool) {
	if !n.IsInt() {
		return 0, false
	}
	v, err := strconv.ParseInt(n.Str, 10, 64)
	return v, err == nil
}

// Float returns the value of any number node as a float64 (possibly ±Inf for a huge literal).
func (n *BenchNode) Float() (float64, bool) {
	if n == nil || n.Kind != BenchNumber {
		return 0, false
	}
	f, err := strconv.ParseFloat(n.Str, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, false
	}
	return f, true
}

// FiniteFloat returns the value of a number node that is finite.
func (n *BenchNode) FiniteFloat() (float64, bool) {
	f, ok := n.Float()
	if !ok || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, false
	}
	return f, true
}

// --- construction and mutation ---

// NewBenchNull returns JSON null.
func NewBenchNull() BenchNode { return BenchNode{} }

// NewBenchString returns a string node.
func NewBenchString(s string) BenchNode { return BenchNode{Kind: BenchString, Str: s} }

// NewBenchBool returns a bool node.
func NewBenchBool(b bool) BenchNode {
	if b {
		return BenchNode{Kind: BenchBool, Str: "true"}
	}
	return BenchNode{Kind: BenchBool, Str: "false"}
}

// NewBenchInt returns an integer number node.
func NewBenchInt(v int64) BenchNode {
	return BenchNode{Kind: BenchNumber, Str: strconv.FormatInt(v, 10)}
}

// NewBenchFloat returns a number node for a finite float, formatted as Python's repr formats a float
// (what Dynamo's json.dump writes): shortest round-trip digits, "10.0" for an integral value, exponent
// form ("1e-05", "1.5e+16") below 1e-4 and from 1e16.
func NewBenchFloat(f float64) BenchNode {
	return BenchNode{Kind: BenchNumber, Str: string(AppendPythonFloat(nil, f))}
}

// NewBenchArray returns an array of the given elements.
func NewBenchArray(elems ...BenchNode) BenchNode { return BenchNode{Kind: BenchArray, Kids: elems} }

// NewBenchObject returns an empty object.
func NewBenchObject() BenchNode { return BenchNode{Kind: BenchObject} }

// Set sets member key of object n to v: replaced in place when present (its position kept, as a Python
// dict assignment keeps it), appended otherwise. It panics when n is not an object.
func (n *BenchNode) Set(key string, v BenchNode) {
	if n.Kind != BenchObject {
		panic("schemas: BenchNode.Set on " + n.Kind.String())
	}
	for i, k := range n.Keys {
		if k == key {
			n.Kids[i] = v
			return
		}
	}
	n.Keys = append(n.Keys, key)
	n.Kids = append(n.Kids, v)
}

// SetAfter sets member key like Set, but a new key is inserted right after member after (appended when
// after is absent).
func (n *BenchNode) SetAfter(after, key string, v BenchNode) {
	if n.Has(key) || !n.Has(after) {
		n.Set(key, v)
		return
	}
	at := 0
	for i, k := range n.Keys {
		if k == after {
			at = i + 1
		}
	}
	n.Keys = append(n.Keys[:at], append([]string{key}, n.Keys[at:]...)...)
	n.Kids = append(n.Kids[:at], append([]BenchNode{v}, n.Kids[at:]...)...)
}

// Delete removes member key of object n, if present.
func (n *BenchNode) Delete(key string) {
	if n == nil || n.Kind != BenchObject {
		return
	}
	for i, k := range n.Keys {
		if k == key {
			n.Keys = append(n.Keys[:i:i], n.Keys[i+1:]...)
			n.Kids = append(n.Kids[:i:i], n.Kids[i+1:]...)
			return
		}
	}
}

// Append appends v to array n. It panics when n is not an array.
func (n *BenchNode) Append(v BenchNode) {
	if n.Kind != BenchArray {
		panic("schemas: BenchNode.Append on " + n.Kind.String())
	}
	n.Kids = append(n.Kids, v)
}

// ShallowCopy returns a copy of n whose own Keys and Kids slices are new (so members can be set or
// deleted without touching n); the children themselves are shared.
func (n *BenchNode) ShallowCopy() BenchNode {
	c := *n
	c.Keys = append([]string(nil), n.Keys...)
	c.Kids = append([]BenchNode(nil), n.Kids...)
	return c
}

// Clone returns a deep copy of n.
func (n *BenchNode) Clone() BenchNode {
	c := *n
	if n.Keys != nil {
		c.Keys = append([]string(nil), n.Keys...)
	}
	if n.Kids != nil {
		c.Kids = make([]BenchNode, len(n.Kids))
		for i := range n.Kids {
			c.Kids[i] = n.Kids[i].Clone()
		}
	}
	return c
}

// --- comparison ---

// BenchEqual reports whether a and b are equal as Python compares the dicts json.loads returns: object
// member order does not matter, numbers compare by value (1 == 1.0), everything else exactly. A nil node
// equals only nil. Raw containers compare by their text.
func BenchEqual(a, b *BenchNode) bool {
	return BenchDiff(a, b) == "" && (a == nil) == (b == nil)
}

// BenchDiff returns the path of the first place where a and b differ ("" when equal, "." for the roots
// themselves), as dotted keys and [i] indices: "engine.attention.backend_requested",
// "iteration_groups[3].rank_results[1].fpms[0].wall_time".
func BenchDiff(a, b *BenchNode) string {
	if a == nil || b == nil {
		if a == b {
			return ""
		}
		return "."
	}
	var path []byte
	if benchDiff(a, b, &path) {
		return ""
	}
	if len(path) == 0 {
		return "."
	}
	return string(path)
}

// benchDiff reports equality; on a difference path holds where.
func benchDiff(a, b *BenchNode, path *[]byte) bool {
	if a.Kind != b.Kind {
		return false
	}
	switch a.Kind {
	case BenchNull:
		return true
	case BenchBool, BenchString:
		return a.Str == b.Str
	case BenchNumber:
		return a.Str == b.Str || numbersEqual(a, b)
	}
	if a.Raw() || b.Raw() {
		return a.Raw() && b.Raw() && a.Str == b.Str
	}
	mark := len(*path)
	if a.Kind == BenchArray {
		if len(a.Kids) != len(b.Kids) {
			return false
		}
		for i := range a.Kids {
			*path = append(*path, '[')
			*path = strconv.AppendInt(*path, int64(i), 10)
			*path = append(*path, ']')
			if !benchDiff(&a.Kids[i], &b.Kids[i], path) {
				return false
			}
			*path = (*path)[:mark]
		}
		return true
	}
	// Objects: same key set, equal values. Report the first key of a (in a's order) that differs, or the
	// first extra key of b.
	var idx map[string]int
	if len(b.Keys) > 16 {
		idx = make(map[string]int, len(b.Keys))
		for i, k := range b.Keys {
			idx[k] = i
		}
	}
	for i, k := range a.Keys {
		j := -1
		if idx != nil {
			if v, ok := idx[k]; ok {
				j = v
			}
		} else {
			j = keyIndex(b.Keys, i, k)
		}
		if mark > 0 {
			*path = append(*path, '.')
		}
		*path = append(*path, k...)
		if j < 0 || !benchDiff(&a.Kids[i], &b.Kids[j], path) {
			return false
		}
		*path = (*path)[:mark]
	}
	if len(a.Keys) != len(b.Keys) {
		for _, k := range b.Keys {
			if a.Get(k) == nil {
				if mark > 0 {
					*path = append(*path, '.')
				}
				*path = append(*path, k...)
				return false
			}
		}
	}
	return true
}

// numbersEqual compares two number literals by value, exactly (an integer beyond 2^53 is not rounded).
func numbersEqual(a, b *BenchNode) bool {
	ai, bi := a.IsInt(), b.IsInt()
	if ai && bi {
		return normInt(a.Str) == normInt(b.Str)
	}
	fa, oka := a.Float()
	fb, okb := b.Float()
	if !oka || !okb {
		return false
	}
	if !ai && !bi {
		return fa == fb
	}
	// An integer against a float: Python compares the exact values.
	intLit, f := a.Str, fb
	if bi {
		intLit, f = b.Str, fa
	}
	if math.IsInf(f, 0) || f != math.Trunc(f) {
		return false
	}
	x, ok := new(big.Int).SetString(intLit, 10)
	if !ok {
		return false
	}
	y, _ := new(big.Float).SetFloat64(f).Int(nil)
	return x.Cmp(y) == 0
}

func normInt(s string) string {
	if s == "-0" {
		return "0"
	}
	return s
}
