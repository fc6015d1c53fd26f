package schemas

import (
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"unicode/utf8"
)

// This file is a strict msgpack reader, written for one job: reading a ForwardPassMetrics payload (a
// msgpack map with string keys, as msgspec encodes a struct) into a node tree without losing any field.
//
// Every msgpack type is accepted below the top level (nil, bool, every int width, float32/64, str, bin,
// array, map, ext), so unknown fields of any type are carried through. The reader never trusts a declared
// length: a str/bin/ext length is checked against the remaining bytes before it is used, an array or map
// count is checked against the remaining bytes (each element needs at least one), and no allocation is
// ever sized from a declared length. Containers nest at most maxDepth levels.
//
// Like Dynamo's Rust reader (rmp_serde into serde_json::Value) it rejects map keys that are not strings,
// strings that are not valid UTF-8 and the reserved marker 0xc1. It is stricter than Dynamo's reader in
// two ways: a duplicate key in one map is an error (Dynamo keeps the last value), and so are bytes after
// the top-level map (Dynamo ignores them). Unlike Dynamo's reader it accepts bin and ext values (see
// canonical_json.go for how they are written).

// parseMsgpack decodes d.src into d.nodes. The top-level value must be a map spanning all of d.src.
func (d *decoder) parseMsgpack() error {
	src := d.src
	if len(src) > maxNodes {
		return d.fail(0, "payload larger than 4 GiB")
	}
	if len(src) == 0 {
		return d.fail(0, "empty payload, want a map")
	}
	k, ok := msgpackKind(src[0])
	if !ok {
		return d.fail(0, "reserved marker 0xc1")
	}
	if k != kindMap {
		return d.fail(0, "top-level value is "+k.article()+" "+k.String()+", want a map")
	}
	end, err := d.readValue(0, 0)
	if err != nil {
		return err
	}
	if end != len(src) {
		return d.fail(end, strconv.Itoa(len(src)-end)+" trailing bytes after the top-level map")
	}
	return nil
}

// fail returns a *decodeError for the value at off, naming the current path.
func (d *decoder) fail(off int, msg string) error {
	return &decodeError{Format: formatMsgpack, Offset: off, Field: d.pathString(), Err: errors.New(msg)}
}

// truncated reports a value whose header or data runs past the end of the payload.
func (d *decoder) truncated(off int, name string) error {
	return d.fail(off, "truncated "+name)
}

// msgpackKind returns the kind a marker byte starts; ok is false for the reserved marker 0xc1.
func msgpackKind(m byte) (k kind, ok bool) {
	switch {
	case m <= 0x7f || m >= 0xe0:
		return kindInt, true
	case m <= 0x8f:
		return kindMap, true
	case m <= 0x9f:
		return kindArray, true
	case m <= 0xbf:
		return kindStr, true
	}
	switch m {
	case 0xc0:
		return kindNil, true
	case 0xc1:
		return 0, false
	case 0xc2, 0xc3:
		return kindBool, true
	case 0xc4, 0xc5, 0xc6:
		return kindBin, true
	case 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return kindExt, true
	case 0xca:
		return kindFloat32, true
	case 0xcb:
		return kindFloat64, true
	case 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3:
		return kindInt, true
	case 0xd9, 0xda, 0xdb:
		return kindStr, true
	case 0xdc, 0xdd:
		return kindArray, true
	}
	return kindMap, true // 0xde, 0xdf
}

// markerNames names the markers 0xc0..0xdf in error messages.
var markerNames = [32]string{
	"nil", "reserved", "false", "true", "bin8", "bin16", "bin32", "ext8",
	"ext16", "ext32", "float32", "float64", "uint8", "uint16", "uint32", "uint64",
	"int8", "int16", "int32", "int64", "fixext1", "fixext2", "fixext4", "fixext8",
	"fixext16", "str8", "str16", "str32", "array16", "array32", "map16", "map32",
}

// readUint reads a size-byte big-endian unsigned integer at p (p is just after the marker at off).
func (d *decoder) readUint(off, p, size int) (uint64, error) {
	if len(d.src)-p < size {
		return 0, d.truncated(off, markerNames[d.src[off]-0xc0])
	}
	b := d.src[p : p+size]
	switch size {
	case 1:
		return uint64(b[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(b)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(b)), nil
	}
	return binary.BigEndian.Uint64(b), nil
}

// readValue decodes the value at off as nodes[len(nodes)...] and returns the offset just after it. level is
// the number of containers enclosing the value.
func (d *decoder) readValue(off, level int) (int, error) {
	src := d.src
	if off >= len(src) {
		return off, d.fail(off, "truncated: value expected at end of payload")
	}
	m := src[off]
	idx := len(d.nodes)
	d.nodes = append(d.nodes, node{off: uint32(off), end: uint32(idx + 1)})
	switch {
	case m <= 0x7f:
		d.setInt(idx, int64(m))
		return off + 1, nil
	case m >= 0xe0:
		d.setInt(idx, int64(int8(m)))
		return off + 1, nil
	case m <= 0x8f:
		return d.readMap(idx, off, off+1, uint64(m&0x0f), level)
	case m <= 0x9f:
		return d.readArray(idx, off, off+1, uint64(m&0x0f), level)
	case m <= 0xbf:
		return d.readStr(idx, off, off+1, uint64(m&0x1f), "fixstr")
	}
	name := markerNames[m-0xc0]
	p := off + 1
	switch m {
	case 0xc0:
		d.nodes[idx].kind = kindNil
		return p, nil
	case 0xc1:
		return off, d.fail(off, "reserved marker 0xc1")
	case 0xc2, 0xc3:
		d.nodes[idx].kind = kindBool
		d.nodes[idx].bits = uint64(m - 0xc2)
		return p, nil
	case 0xc4, 0xc5, 0xc6: // bin8/16/32
		size := 1 << (m - 0xc4)
		n, err := d.readUint(off, p, size)
		if err != nil {
			return off, err
		}
		p += size
		if uint64(len(src)-p) < n {
			return off, d.truncated(off, name)
		}
		d.nodes[idx].kind = kindBin
		d.setRaw(idx, p, p+int(n))
		return p + int(n), nil
	case 0xc7, 0xc8, 0xc9: // ext8/16/32: length, type, data
		size := 1 << (m - 0xc7)
		n, err := d.readUint(off, p, size)
		if err != nil {
			return off, err
		}
		p += size
		return d.readExt(idx, off, p, n, name)
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext1..16: type, data
		return d.readExt(idx, off, p, 1<<(m-0xd4), name)
	case 0xca:
		v, err := d.readUint(off, p, 4)
		if err != nil {
			return off, err
		}
		d.nodes[idx].kind = kindFloat32
		d.nodes[idx].bits = v
		return p + 4, nil
	case 0xcb:
		v, err := d.readUint(off, p, 8)
		if err != nil {
			return off, err
		}
		d.nodes[idx].kind = kindFloat64
		d.nodes[idx].bits = v
		return p + 8, nil
	case 0xcc, 0xcd, 0xce, 0xcf: // uint8..64
		size := 1 << (m - 0xcc)
		v, err := d.readUint(off, p, size)
		if err != nil {
			return off, err
		}
		if v > math.MaxInt64 {
			d.nodes[idx].kind = kindUint
			d.nodes[idx].bits = v
		} else {
			d.setInt(idx, int64(v))
		}
		return p + size, nil
	case 0xd0, 0xd1, 0xd2, 0xd3: // int8..64
		size := 1 << (m - 0xd0)
		v, err := d.readUint(off, p, size)
		if err != nil {
			return off, err
		}
		var x int64
		switch size {
		case 1:
			x = int64(int8(v))
		case 2:
			x = int64(int16(v))
		case 4:
			x = int64(int32(v))
		default:
			x = int64(v)
		}
		d.setInt(idx, x)
		return p + size, nil
	case 0xd9, 0xda, 0xdb: // str8/16/32
		size := 1 << (m - 0xd9)
		n, err := d.readUint(off, p, size)
		if err != nil {
			return off, err
		}
		return d.readStr(idx, off, p+size, n, name)
	case 0xdc, 0xdd: // array16/32
		size := 2 << (m - 0xdc)
		n, err := d.readUint(off, p, size)
		if err != nil {
			return off, err
		}
		return d.readArray(idx, off, p+size, n, level)
	}
	// 0xde, 0xdf: map16/32
	size := 2 << (m - 0xde)
	n, err := d.readUint(off, p, size)
	if err != nil {
		return off, err
	}
	return d.readMap(idx, off, p+size, n, level)
}

func (d *decoder) setInt(idx int, v int64) {
	d.nodes[idx].kind = kindInt
	d.nodes[idx].bits = uint64(v)
}

// readStr reads n bytes of string data at p for the str value whose marker is at off.
func (d *decoder) readStr(idx, off, p int, n uint64, name string) (int, error) {
	if uint64(len(d.src)-p) < n {
		return off, d.truncated(off, name)
	}
	if !utf8.Valid(d.src[p : p+int(n)]) {
		return off, d.fail(off, "invalid UTF-8 in "+name)
	}
	d.nodes[idx].kind = kindStr
	d.setRaw(idx, p, p+int(n))
	return p + int(n), nil
}

// readExt reads the type byte and n bytes of data at p for the ext value whose marker is at off.
func (d *decoder) readExt(idx, off, p int, n uint64, name string) (int, error) {
	if p >= len(d.src) || uint64(len(d.src)-p-1) < n {
		return off, d.truncated(off, name)
	}
	d.nodes[idx].kind = kindExt
	d.nodes[idx].ext = int8(d.src[p])
	d.setRaw(idx, p+1, p+1+int(n))
	return p + 1 + int(n), nil
}

// readArray reads n elements starting at p for the array whose marker is at off.
func (d *decoder) readArray(idx, off, p int, n uint64, level int) (int, error) {
	if level+1 > maxDepth {
		return off, d.fail(off, "nesting deeper than "+strconv.Itoa(maxDepth)+" levels")
	}
	if uint64(len(d.src)-p) < n { // every element takes at least one byte
		return off, d.fail(off, "truncated array: "+strconv.FormatUint(n, 10)+" elements declared, "+
			strconv.Itoa(len(d.src)-p)+" bytes remain")
	}
	seg := d.depth
	d.depth++
	for i := 0; i < int(n); i++ {
		d.path[seg] = indexSeg(i)
		var err error
		if p, err = d.readValue(p, level+1); err != nil {
			return off, err
		}
	}
	d.depth--
	d.nodes[idx].kind = kindArray
	d.nodes[idx].count = uint32(n)
	d.nodes[idx].end = uint32(len(d.nodes))
	d.setRaw(idx, off, p)
	return p, nil
}

// readMap reads n key/value pairs starting at p for the map whose marker is at off. Keys must be
// strings, and unique within the map.
func (d *decoder) readMap(idx, off, p int, n uint64, level int) (int, error) {
	if level+1 > maxDepth {
		return off, d.fail(off, "nesting deeper than "+strconv.Itoa(maxDepth)+" levels")
	}
	if uint64(len(d.src)-p)/2 < n { // every pair takes at least two bytes
		return off, d.fail(off, "truncated map: "+strconv.FormatUint(n, 10)+" pairs declared, "+
			strconv.Itoa(len(d.src)-p)+" bytes remain")
	}
	for i := 0; i < int(n); i++ {
		if p >= len(d.src) {
			return off, d.fail(p, "truncated: map key expected at end of payload")
		}
		if k, ok := msgpackKind(d.src[p]); ok && k != kindStr {
			return off, d.fail(p, "map key is "+k.article()+" "+k.String()+", want a string")
		}
		key := len(d.nodes)
		var err error
		if p, err = d.readValue(p, level+1); err != nil {
			return off, err
		}
		d.path[d.depth] = keySeg(key)
		d.depth++
		p, err = d.readValue(p, level+1)
		d.depth--
		if err != nil {
			return off, err
		}
	}
	d.nodes[idx].kind = kindMap
	d.nodes[idx].count = uint32(n)
	d.nodes[idx].end = uint32(len(d.nodes))
	d.setRaw(idx, off, p)
	if dup := d.checkDuplicateKeys(idx); dup >= 0 {
		return off, d.duplicateKey(dup, d.fail)
	}
	return p, nil
}
