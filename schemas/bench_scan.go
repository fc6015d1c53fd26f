package schemas

import (
	"strconv"
	"strings"
)

// BenchScanner reads one JSON document value by value without building it: a merger walks a rank
// artefact of 170 MB with it, comparing the parts that must equal the reference rank's (Compare),
// building only the small parts it needs (Parse) and skipping the rest (Skip), so one tree — the
// reference rank's — is in memory at a time.
//
// The scanner aliases data: strings of nodes returned by Parse point into it, so data must not change
// while they are in use (detach them with Clone and strings.Clone to keep them longer). Methods move the
// scanner past the value at its position; after an error, or after Compare reports a difference, the
// scanner's position is unspecified and it must not be used further.
type BenchScanner struct {
	p    *benchParser
	diff []string // reversed path segments of the last Compare difference
}

// NewBenchScanner returns a scanner positioned at the document's top-level value.
func NewBenchScanner(data []byte) *BenchScanner {
	s := &BenchScanner{p: newBenchParser(data)}
	if len(data) >= 3 && string(data[:3]) == "\xef\xbb\xbf" {
		s.p.pos = len(data) + 1 // reported as malformed by the first call
	}
	return s
}

func (s *BenchScanner) start() error {
	if s.p.pos > len(s.p.b) {
		return s.p.fail(0, "byte order mark")
	}
	s.p.ws()
	if s.p.pos >= len(s.p.b) {
		return s.p.fail(s.p.pos, "unexpected end of input")
	}
	return nil
}

// Offset is the scanner's byte offset.
func (s *BenchScanner) Offset() int { return s.p.pos }

// Kind reports the kind of the value at the scanner's position.
func (s *BenchScanner) Kind() (benchKind, error) {
	if err := s.start(); err != nil {
		return 0, err
	}
	switch c := s.p.b[s.p.pos]; {
	case c == '{':
		return BenchObject, nil
	case c == '[':
		return BenchArray, nil
	case c == '"':
		return BenchString, nil
	case c == 't' || c == 'f':
		return BenchBool, nil
	case c == 'n':
		return BenchNull, nil
	case c == '-' || c >= '0' && c <= '9':
		return BenchNumber, nil
	}
	return 0, s.p.fail(s.p.pos, "unexpected character "+strconv.QuoteRune(rune(s.p.b[s.p.pos])))
}

// Finish checks that only whitespace follows the top-level value.
func (s *BenchScanner) Finish() error {
	s.p.ws()
	if s.p.pos != len(s.p.b) {
		return s.p.fail(s.p.pos, "data after the top-level value")
	}
	return nil
}

// Skip moves past the value at the scanner's position, checking its syntax.
func (s *BenchScanner) Skip() error {
	if err := s.start(); err != nil {
		return err
	}
	return s.p.skip()
}

// SkipUnchecked moves past the value at the scanner's position finding only where it ends (matching
// brackets outside strings), without checking the syntax inside it: several times faster than Skip, for
// a pass whose input is fully parsed or compared by a later pass.
func (s *BenchScanner) SkipUnchecked() error {
	if err := s.start(); err != nil {
		return err
	}
	return s.p.skipUnchecked()
}

// Parse builds the value at the scanner's position (duplicate keys rejected, as ParseBenchJSON does).
func (s *BenchScanner) Parse() (BenchNode, error) {
	if err := s.start(); err != nil {
		return BenchNode{}, err
	}
	return s.p.value(false)
}

// Object calls fn for each member of the object at the scanner's position, in document order, with the
// scanner positioned at the member's value; fn must consume the value (Skip, Parse, Compare, Object or
// Array). A duplicate key is an error. An error from fn stops the walk and is returned as is.
func (s *BenchScanner) Object(fn func(key string) error) error {
	if empty, err := s.open('{', '}', "an object"); empty || err != nil {
		return err
	}
	p := s.p
	var seen map[string]struct{}
	for {
		key, keyOff, err := p.memberKey()
		if err != nil {
			return err
		}
		if seen == nil {
			seen = map[string]struct{}{}
		}
		if _, dup := seen[key]; dup {
			return p.fail(keyOff, "duplicate key "+strconv.Quote(key))
		}
		seen[key] = struct{}{}
		if err := fn(key); err != nil {
			return err
		}
		end, err := p.next('}', "unexpected end of input in object", "expected ',' or '}' in object")
		if err != nil || end {
			return err
		}
	}
}

// Array calls fn for each element of the array at the scanner's position with the scanner positioned at
// the element; fn must consume it.
func (s *BenchScanner) Array(fn func(i int) error) error {
	if empty, err := s.open('[', ']', "an array"); empty || err != nil {
		return err
	}
	p := s.p
	for i := 0; ; i++ {
		p.ws()
		if err := fn(i); err != nil {
			return err
		}
		end, err := p.next(']', "unexpected end of input in array", "expected ',' or ']' in array")
		if err != nil || end {
			return err
		}
	}
}

// open enters the container that opening starts (what names it in the error when the value at the
// scanner's position is something else); empty is true, and the container consumed, when it holds
// nothing.
func (s *BenchScanner) open(opening, closing byte, what string) (empty bool, err error) {
	if err := s.start(); err != nil {
		return false, err
	}
	p := s.p
	if p.b[p.pos] != opening {
		return false, p.fail(p.pos, "expected "+what)
	}
	return p.open(closing)
}

// Compare compares the value at the scanner's position with ref as BenchDiff compares two trees (object
// member order ignored, numbers by value), without building the value. It returns "" when they are
// equal, otherwise the path of the first difference ("." for the value itself), or a syntax error.
func (s *BenchScanner) Compare(ref *BenchNode) (string, error) {
	if err := s.start(); err != nil {
		return "", err
	}
	s.diff = s.diff[:0]
	eq, err := s.compare(ref)
	if err != nil || eq {
		return "", err
	}
	var b strings.Builder
	for i := len(s.diff) - 1; i >= 0; i-- {
		seg := s.diff[i]
		if b.Len() > 0 && !strings.HasPrefix(seg, "[") {
			b.WriteByte('.')
		}
		b.WriteString(seg)
	}
	if b.Len() == 0 {
		return ".", nil
	}
	return b.String(), nil
}

func (s *BenchScanner) compare(ref *BenchNode) (bool, error) {
	p := s.p
	if p.pos >= len(p.b) {
		return false, p.fail(p.pos, "unexpected end of input")
	}
	if ref == nil {
		return false, nil
	}
	if (ref.Kind == BenchObject || ref.Kind == BenchArray) && ref.Str != "" { // raw
		full, err := ParseBenchJSON([]byte(ref.Str))
		if err != nil {
			return false, nil
		}
		ref = full
	}
	switch c := p.b[p.pos]; {
	case c == '{':
		if ref.Kind != BenchObject {
			return false, nil
		}
		return s.compareObject(ref)
	case c == '[':
		if ref.Kind != BenchArray {
			return false, nil
		}
		empty, err := p.open(']')
		if err != nil {
			return false, err
		}
		i := 0
		if empty {
			if len(ref.Kids) != 0 {
				s.diff = append(s.diff, "[0]")
				return false, nil
			}
			return true, nil
		}
		for ; ; i++ {
			p.ws()
			if i >= len(ref.Kids) {
				s.diff = append(s.diff, "["+strconv.Itoa(i)+"]")
				return false, nil
			}
			eq, err := s.compare(&ref.Kids[i])
			if err != nil {
				return false, err
			}
			if !eq {
				s.diff = append(s.diff, "["+strconv.Itoa(i)+"]")
				return false, nil
			}
			end, err := p.next(']', "unexpected end of input in array", "expected ',' or ']' in array")
			if err != nil {
				return false, err
			}
			if !end {
				continue
			}
			if i+1 != len(ref.Kids) {
				s.diff = append(s.diff, "["+strconv.Itoa(i+1)+"]")
				return false, nil
			}
			return true, nil
		}
	}
	v, err := p.value(false)
	if err != nil {
		return false, err
	}
	if v.Kind != ref.Kind {
		return false, nil
	}
	switch v.Kind {
	case BenchNull:
		return true, nil
	case BenchNumber:
		return v.Str == ref.Str || numbersEqual(&v, ref), nil
	}
	return v.Str == ref.Str, nil
}

func (s *BenchScanner) compareObject(ref *BenchNode) (bool, error) {
	p := s.p
	empty, err := p.open('}')
	if err != nil {
		return false, err
	}
	var seenSmall uint64
	var seenLarge []bool
	if len(ref.Keys) > 64 {
		seenLarge = make([]bool, len(ref.Keys))
	}
	count := 0
	if !empty {
		for i := 0; ; i++ {
			p.ws()
			if p.pos >= len(p.b) || p.b[p.pos] != '"' {
				return false, p.fail(p.pos, "expected a string key")
			}
			keyOff := p.pos
			key, err := p.string()
			if err != nil {
				return false, err
			}
			j := keyIndex(ref.Keys, i, key)
			if j < 0 {
				s.diff = append(s.diff, key)
				return false, nil
			}
			if seenLarge != nil {
				if seenLarge[j] {
					return false, p.fail(keyOff, "duplicate key "+strconv.Quote(key))
				}
				seenLarge[j] = true
			} else {
				if seenSmall&(1<<uint(j)) != 0 {
					return false, p.fail(keyOff, "duplicate key "+strconv.Quote(key))
				}
				seenSmall |= 1 << uint(j)
			}
			count++
			p.ws()
			if p.pos >= len(p.b) || p.b[p.pos] != ':' {
				return false, p.fail(p.pos, "expected ':' after key")
			}
			p.pos++
			p.ws()
			eq, err := s.compare(&ref.Kids[j])
			if err != nil {
				return false, err
			}
			if !eq {
				s.diff = append(s.diff, key)
				return false, nil
			}
			end, err := p.next('}', "unexpected end of input in object", "expected ',' or '}' in object")
			if err != nil {
				return false, err
			}
			if end {
				break
			}
		}
	}
	if count != len(ref.Keys) {
		for j, k := range ref.Keys {
			seen := false
			if seenLarge != nil {
				seen = seenLarge[j]
			} else {
				seen = seenSmall&(1<<uint(j)) != 0
			}
			if !seen {
				s.diff = append(s.diff, k)
				return false, nil
			}
		}
	}
	return true, nil
}
