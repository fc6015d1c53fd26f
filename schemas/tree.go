package schemas

import (
	"math"
	"strconv"
	"sync"
)

// kind is the type of one decoded value. The same tree holds values read from msgpack (msgpack.go) and
// from JSON (json_parse.go), so validation (validate.go) is written once for both formats.
type kind uint8

const (
	kindNil kind = iota
	kindBool
	kindInt     // bits holds an int64 (msgpack int*, negative fixint, or a JSON integer)
	kindUint    // bits holds a uint64 > math.MaxInt64 (smaller non-negative values are kindInt)
	kindBigInt  // JSON only: an integer literal outside the int64/uint64 range; raw(n) is its text
	kindFloat32 // bits holds the float32 bits (msgpack float32)
	kindFloat64 // bits holds the float64 bits
	kindStr     // raw(n) is the UTF-8 text (validated), unescaped
	kindBin     // raw(n) is the bytes
	kindExt     // raw(n) is the data, ext the type
	kindArray   // count elements follow in pre-order
	kindMap     // count key/value pairs follow in pre-order; keys are always kindStr
)

// String names a kind in error messages, in words a user of either format understands.
func (k kind) String() string {
	switch k {
	case kindNil:
		return "null"
	case kindBool:
		return "bool"
	case kindInt, kindUint, kindBigInt:
		return "integer"
	case kindFloat32, kindFloat64:
		return "float"
	case kindStr:
		return "string"
	case kindBin:
		return "bin"
	case kindExt:
		return "ext"
	case kindArray:
		return "array"
	case kindMap:
		return "map"
	}
	return "unknown"
}

// article returns "a" or "an" for k, for messages like "top-level value is an array".
func (k kind) article() string {
	switch k {
	case kindInt, kindUint, kindBigInt, kindExt, kindArray:
		return "an"
	}
	return "a"
}

// node is one value of a decoded tree. A tree is a flat slice in pre-order: a container's children follow
// it directly, and every node records in end the index of the first node after its subtree, so siblings
// are reached without recursion and without per-node allocations. Nodes hold no pointers (bytes are
// offsets into the tree's buffers), so building and recycling a tree costs the garbage collector nothing.
type node struct {
	kind  kind
	ext   int8   // kindExt: the ext type
	inAux bool   // lo:hi index tree.aux (an unescaped JSON string) instead of tree.src
	off   uint32 // byte offset of the value in its source (for errors)
	count uint32 // kindArray: elements; kindMap: pairs
	end   uint32 // index of the first node after this subtree
	bits  uint64 // kindInt/kindUint/kindFloat32/kindFloat64/kindBool: the value
	// lo:hi: kindStr/kindBin/kindExt: the content; kindBigInt: the literal; containers: the encoded
	// source bytes of the whole container.
	lo, hi uint32
}

// tree is a decoded document: the nodes and the buffers their bytes live in. It is only valid while the
// decoder that built it is.
type tree struct {
	src   []byte
	aux   []byte // unescaped JSON strings
	nodes []node
}

// raw returns the bytes of n (see node.lo).
func (t *tree) raw(n *node) []byte {
	if n.inAux {
		return t.aux[n.lo:n.hi]
	}
	return t.src[n.lo:n.hi]
}

// setRaw points nodes[i] at src[lo:hi].
func (t *tree) setRaw(i, lo, hi int) {
	t.nodes[i].lo, t.nodes[i].hi = uint32(lo), uint32(hi)
}

func (n *node) int64() int64     { return int64(n.bits) }
func (n *node) uint64() uint64   { return n.bits }
func (n *node) float64() float64 { return math.Float64frombits(n.bits) }
func (n *node) float32() float32 { return math.Float32frombits(uint32(n.bits)) }

// isNumber reports whether n is an integer or a float.
func (n *node) isNumber() bool {
	switch n.kind {
	case kindInt, kindUint, kindBigInt, kindFloat32, kindFloat64:
		return true
	}
	return false
}

// numberOf returns n as a float64 (n.isNumber must hold). A float32 is widened exactly.
func (t *tree) numberOf(n *node) float64 {
	switch n.kind {
	case kindInt:
		return float64(n.int64())
	case kindUint:
		return float64(n.uint64())
	case kindBigInt:
		f, _ := strconv.ParseFloat(string(t.raw(n)), 64)
		return f
	case kindFloat32:
		return float64(n.float32())
	}
	return n.float64()
}

// maxNodes bounds the nodes of one tree. Every value takes at least one byte of its source, so the bound
// only matters for sources over 4 GiB, which node offsets (uint32) cannot address anyway.
const maxNodes = math.MaxUint32

// maxDepth is the deepest container nesting accepted in a payload; the top-level map is depth 1.
const maxDepth = 32

// decoder holds the reusable state of one decode: the node tree, the scratch space for unescaped JSON
// strings, the path stack used to name the field of an error, and the output buffer of the canonical
// JSON. Decoders are pooled; nothing a decoder holds may outlive the call that took it from the pool.
type decoder struct {
	tree
	path  [maxDepth + 1]pathSeg
	depth int    // segments of path in use
	out   []byte // canonical JSON scratch
}

// pathSeg is one step of the path to the value being decoded: the node index of a map key, or, when key
// is -1, an array index.
type pathSeg struct {
	key   int32
	index int32
}

func keySeg(key int) pathSeg     { return pathSeg{key: int32(key)} }
func indexSeg(index int) pathSeg { return pathSeg{key: -1, index: int32(index)} }

var decoderPool = sync.Pool{New: func() any { return &decoder{tree: tree{nodes: make([]node, 0, 64)}} }}

func getDecoder(src []byte) *decoder {
	d := decoderPool.Get().(*decoder)
	d.src = src
	d.nodes = d.nodes[:0]
	d.aux = d.aux[:0]
	d.out = d.out[:0]
	d.depth = 0
	return d
}

// putDecoder returns d to the pool, dropping references into the caller's buffers so the pool does not
// keep them alive, and dropping buffers that grew unusually large.
func putDecoder(d *decoder) {
	d.src = nil
	if cap(d.nodes) > 4096 {
		d.nodes = make([]node, 0, 64)
	}
	if cap(d.aux) > 64<<10 {
		d.aux = nil
	}
	if cap(d.out) > 64<<10 {
		d.out = nil
	}
	decoderPool.Put(d)
}

// pathString renders the current path as a dotted field path: map keys joined by '.', array indices as
// "[i]" (for example "scheduled_requests.num_prefill_requests" or "extra[2].name").
func (d *decoder) pathString() string {
	var b []byte
	for _, s := range d.path[:d.depth] {
		if s.key < 0 {
			b = append(b, '[')
			b = strconv.AppendInt(b, int64(s.index), 10)
			b = append(b, ']')
			continue
		}
		if len(b) > 0 {
			b = append(b, '.')
		}
		b = append(b, d.raw(&d.nodes[s.key])...)
	}
	return string(b)
}

// joinField joins a parent path and a key into a dotted path.
func joinField(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

// duplicateKey is the error for dup, a key that repeats an earlier one of its map
// (checkDuplicateKeys): made by the reader's fail (jfail or fail) at the key's offset, its path ending
// at the key.
func (d *decoder) duplicateKey(dup int, fail func(off int, msg string) error) error {
	d.path[d.depth] = keySeg(dup)
	d.depth++
	err := fail(int(d.nodes[dup].off), "duplicate key "+strconv.Quote(string(d.raw(&d.nodes[dup]))))
	d.depth--
	return err
}

// checkDuplicateKeys reports the index of the first key of the map at nodes[m] that repeats an earlier
// key, or -1. Small maps are compared pairwise (no allocation); large ones use a set, so a hostile map
// of many keys costs linear time.
func (d *decoder) checkDuplicateKeys(m int) int {
	n := &d.nodes[m]
	if n.count < 2 {
		return -1
	}
	if n.count <= 16 {
		var keys [16]int
		k := 0
		for i := m + 1; i < int(n.end); i = int(d.nodes[i+1].end) {
			for _, prev := range keys[:k] {
				if string(d.raw(&d.nodes[prev])) == string(d.raw(&d.nodes[i])) {
					return i
				}
			}
			keys[k] = i
			k++
		}
		return -1
	}
	set := make(map[string]struct{}, n.count)
	for i := m + 1; i < int(n.end); i = int(d.nodes[i+1].end) {
		key := string(d.raw(&d.nodes[i]))
		if _, dup := set[key]; dup {
			return i
		}
		set[key] = struct{}{}
	}
	return -1
}
