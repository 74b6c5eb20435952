package checkpoint

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// The safetensors layout, on byte slices: no I/O (safetensors_file.go
// moves the bytes). A safetensors file is
//
//	8 bytes      n, little-endian: the length of the JSON header
//	n bytes      the header: a JSON object mapping each tensor's name to
//	             {"dtype", "shape", "data_offsets": [begin, end]} (offsets
//	             relative to the data region), plus an optional
//	             "__metadata__" object of strings
//	the rest     the data region: the tensors' bytes, back to back
//
// The header lists the tensors in the order of their data, which is the
// safetensors package's: by dtype, in the order of its Dtype enum from the
// last (U64, I64, F64...) to the first (BOOL), then by name; its JSON is
// the package's too (serde_json's: no spaces, non-ASCII text as UTF-8).
// For the same tensors and metadata our bytes are therefore the package's,
// but for the padding: the header is padded with spaces (JSON whitespace,
// which every reader skips) so that the data region starts on a multiple
// of an alignment (SafetensorsFileAlign for a file; 8, the package's own,
// in memory), so that in a file of large tensors the first tensor, and
// each one whose predecessors' sizes add up to a multiple of it, lie where
// O_DIRECT and GDS can move them in place.

// safetensorsMaxHeader is the largest header length a reader accepts: the
// format's own limit (MAX_HEADER_SIZE of the safetensors package), which
// keeps a damaged length from making a reader allocate gigabytes.
const safetensorsMaxHeader = 100_000_000

// safetensorsMetaKey is the header key of the metadata, which no tensor
// may take.
const safetensorsMetaKey = "__metadata__"

// safetensorsItemBits is the element size in bits of each dtype name of
// the format (the dtypes of the safetensors package's Rust core, 0.8):
// the sub-byte ones too (F4, two to a byte; F6, four to three bytes),
// whose tensors must come to whole bytes. pyfastensor/safetensors.py maps
// to torch dtypes those the running torch has.
var safetensorsItemBits = map[string]int64{
	"F64": 64, "F32": 32, "F16": 16, "BF16": 16,
	"I64": 64, "I32": 32, "I16": 16, "I8": 8,
	"U64": 64, "U32": 32, "U16": 16, "U8": 8,
	"BOOL": 8, "C64": 64,
	"F8_E4M3": 8, "F8_E5M2": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F8_E8M0": 8,
	"F6_E2M3": 6, "F6_E3M2": 6, "F4": 4,
}

// safetensorsDTypeRank is each dtype's place in the safetensors package's
// Dtype enum (0.8), whose order sorts a file's data: the highest first.
var safetensorsDTypeRank = map[string]int{
	"BOOL": 0, "F4": 1, "F6_E2M3": 2, "F6_E3M2": 3, "U8": 4, "I8": 5,
	"F8_E5M2": 6, "F8_E4M3": 7, "F8_E8M0": 8, "F8_E4M3FNUZ": 9, "F8_E5M2FNUZ": 10,
	"I16": 11, "U16": 12, "F16": 13, "BF16": 14, "I32": 15, "U32": 16, "F32": 17,
	"C64": 18, "F64": 19, "I64": 20, "U64": 21,
}

// SafetensorsPackageAlign is the alignment of the data region the
// safetensors package gives its files and bytes (its N_ALIGN): what a
// header is padded to where O_DIRECT has nothing to gain.
const SafetensorsPackageAlign = 8

// SafetensorsFileAlign is the alignment of the data region of a file of
// tensors: transfer.Alignment where one tensor at least is large enough
// for O_DIRECT (transfer.DirectThreshold), so that it can be read in
// place; else the package's own, since every read of such a file goes
// through the page cache (and the file is then the package's byte for
// byte).
func SafetensorsFileAlign(tensors []STensor) int64 {
	for i := range tensors {
		if tensors[i].Size >= transfer.DirectThreshold {
			return transfer.Alignment
		}
	}
	return SafetensorsPackageAlign
}

// ErrUnknownDType is wrapped by the error of a safetensors header with a
// dtype name this build does not know (from a newer format, say): a kind
// of gds.ErrUnsupported, so Python sees an UnsupportedError, not a
// CorruptFileError, for a file that may well be valid.
var ErrUnknownDType = gds.Named(gds.ErrUnsupported, "unsupported safetensors dtype")

// STensor is one tensor of a safetensors file to write: its name, dtype
// name, shape and size in bytes (which must be the shape's element count
// times the dtype's element size). Data holds its Size bytes for
// SaveSafetensors; LayoutSafetensors does not read it.
type STensor struct {
	Name  string  `json:"name"`
	DType string  `json:"dtype"`
	Shape []int64 `json:"shape"`
	Size  int64   `json:"size"`
	Data  []byte  `json:"-"`
}

// MetaEntry is one key and value of a file's __metadata__, written in the
// caller's order (the order of the Python dict it came from).
type MetaEntry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// LayoutSafetensors lays out a safetensors file of tensors and metadata,
// its data region aligned to align (a power of two). It returns the
// header (the 8-byte length and the JSON, padded with spaces so that the
// data region starts on a multiple of align), the file offset of each
// tensor's data (in the order of tensors) and the file's size.
//
// The data is ordered as the safetensors package orders it (by dtype, see
// safetensorsDTypeRank, then by name), and the header lists the tensors in
// that order after "__metadata__" (its entries in the caller's order), in
// serde_json's spelling. A nil metadata writes no "__metadata__"; an
// empty, non-nil one writes an empty object.
//
// Invalid tensors or metadata (an unknown dtype, a size that is not the
// shape's, a repeated or reserved name, text that is not UTF-8) give an
// error wrapping gds.ErrInvalid.
func LayoutSafetensors(tensors []STensor, metadata []MetaEntry, align int64) (header []byte, offsets []int64, size int64, err error) {
	if err := checkSafetensors(tensors, metadata); err != nil {
		return nil, nil, 0, err
	}
	if align <= 0 || align&(align-1) != 0 {
		return nil, nil, 0, fmt.Errorf("%w: safetensors: alignment %d is not a power of two", gds.ErrInvalid, align)
	}
	order := make([]int, len(tensors))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		ta, tb := &tensors[a], &tensors[b]
		return cmp.Or(cmp.Compare(safetensorsDTypeRank[tb.DType], safetensorsDTypeRank[ta.DType]), cmp.Compare(ta.Name, tb.Name))
	})

	text := []byte{'{'}
	if metadata != nil {
		text = appendJSONString(text, safetensorsMetaKey)
		text = append(text, ":{"...)
		for i, m := range metadata {
			if i > 0 {
				text = append(text, ',')
			}
			text = appendJSONString(text, m.Key)
			text = append(text, ':')
			text = appendJSONString(text, m.Value)
		}
		text = append(text, '}')
	}
	rel := make([]int64, len(tensors)) // offsets in the data region
	var off int64
	for k, i := range order {
		t := &tensors[i]
		if k > 0 || metadata != nil {
			text = append(text, ',')
		}
		rel[i] = off
		text = appendJSONString(text, t.Name)
		text = append(text, `:{"dtype":`...)
		text = appendJSONString(text, t.DType)
		text = append(text, `,"shape":[`...)
		for j, d := range t.Shape {
			if j > 0 {
				text = append(text, ',')
			}
			text = strconv.AppendInt(text, d, 10)
		}
		text = append(text, `],"data_offsets":[`...)
		text = strconv.AppendInt(text, off, 10)
		text = append(text, ',')
		text = strconv.AppendInt(text, off+t.Size, 10)
		text = append(text, "]}"...)
		off += t.Size
	}
	text = append(text, '}')
	// Pad so that 8 + len(text), where the data starts, is a multiple of
	// the alignment: the padding is what the next multiple lacks.
	pad := int((align - int64(8+len(text))%align) % align)
	header = binary.LittleEndian.AppendUint64(make([]byte, 0, 8+len(text)+pad), uint64(len(text)+pad))
	header = append(header, text...)
	header = append(header, bytes.Repeat([]byte{' '}, pad)...)

	start := int64(len(header))
	if off > math.MaxInt64-start {
		return nil, nil, 0, fmt.Errorf("%w: safetensors: %d bytes of tensors are too many", gds.ErrInvalid, off)
	}
	offsets = make([]int64, len(tensors))
	for i := range rel {
		offsets[i] = start + rel[i]
	}
	return header, offsets, start + off, nil
}

// checkSafetensors checks what LayoutSafetensors is given.
func checkSafetensors(tensors []STensor, metadata []MetaEntry) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: safetensors: %s", gds.ErrInvalid, fmt.Sprintf(format, args...))
	}
	seen := make(map[string]bool, len(tensors))
	var total int64
	for i := range tensors {
		t := &tensors[i]
		switch {
		case !utf8.ValidString(t.Name):
			return bad("tensor name %q is not UTF-8", t.Name)
		case t.Name == safetensorsMetaKey:
			return bad("a tensor cannot be called %q: the header keeps its metadata there", t.Name)
		case seen[t.Name]:
			return bad("tensor %q appears twice", t.Name)
		}
		seen[t.Name] = true
		bits, ok := safetensorsItemBits[t.DType]
		if !ok {
			return bad("tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		n, ok := shapeBytes(t.Shape, bits)
		if !ok || n != t.Size {
			return bad("tensor %q: %d bytes do not match shape %v of %s", t.Name, t.Size, t.Shape, t.DType)
		}
		if total += n; total < 0 {
			return bad("tensor %q: the tensors' sizes overflow", t.Name)
		}
	}
	keys := make(map[string]bool, len(metadata))
	for _, m := range metadata {
		switch {
		case !utf8.ValidString(m.Key) || !utf8.ValidString(m.Value):
			return bad("metadata %q: %q is not UTF-8", m.Key, m.Value)
		case keys[m.Key]:
			return bad("metadata key %q appears twice", m.Key)
		}
		keys[m.Key] = true
	}
	return nil
}

// shapeBytes returns the bytes of a tensor of shape with elements of bits
// bits, and false when a dimension is negative, the size overflows, or
// the elements do not come to whole bytes (an odd count of F4 elements).
func shapeBytes(shape []int64, bits int64) (int64, bool) {
	n := int64(1) // elements
	for _, d := range shape {
		if d < 0 {
			return 0, false
		}
		if d == 0 {
			n = 0
		}
	}
	for _, d := range shape {
		if n == 0 {
			break
		}
		if d > math.MaxInt64/n {
			return 0, false
		}
		n *= d
	}
	if n > math.MaxInt64/bits || n*bits%8 != 0 {
		return 0, false
	}
	return n * bits / 8, true
}

// appendJSONString appends s (valid UTF-8) as serde_json writes a string:
// '"' and '\\' take a backslash; \b \f \n \r \t; the other control
// characters below U+0020 as \u00XX in lower-case hexadecimal; everything
// else, non-ASCII text included, as it is.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\b':
			b = append(b, `\b`...)
		case c == '\f':
			b = append(b, `\f`...)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '\r':
			b = append(b, `\r`...)
		case c == '\t':
			b = append(b, `\t`...)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// SafetensorsEntry is one tensor of a parsed safetensors file: its name,
// dtype name, shape, and where its bytes lie (Begin to End, file offsets).
type SafetensorsEntry struct {
	Name  string  `json:"name"`
	DType string  `json:"dtype"`
	Shape []int64 `json:"shape"`
	Begin int64   `json:"begin"`
	End   int64   `json:"end"`
}

// SafetensorsHeader is a parsed, validated safetensors header: the
// tensors in the header's order, the metadata (nil when there is none) and
// the file offset of the data region.
type SafetensorsHeader struct {
	Tensors   []SafetensorsEntry `json:"tensors"`
	Metadata  map[string]string  `json:"metadata"`
	DataStart int64              `json:"data_start"`
}

// ParseSafetensorsHeader parses and validates the header of the
// safetensors file at path, of fileSize bytes, whose first bytes are data
// (at least 8, and then the whole header when its length fits the file).
// It checks what a safetensors reader must: a header length within the
// file and the format's limit of 100,000,000 bytes; a UTF-8 JSON object;
// for each tensor a known dtype, a shape of non-negative integers, and
// data_offsets of two non-negative integers whose difference is the
// shape's size (a whole number of bytes, for the sub-byte dtypes); the tensors filling the data region exactly, without
// holes or overlaps, to the end of the file; and "__metadata__" an object
// of strings. A tensor may not appear twice.
//
// A file that fails a check gives an error wrapping ErrCorrupt that names
// the file, the tensor where there is one, and what is wrong. A dtype
// name outside the format's known ones gives an error wrapping
// ErrUnknownDType (gds.ErrUnsupported) naming the file, the tensor and the
// dtype. Data shorter than the file's header gives an error wrapping
// gds.ErrInvalid (the caller's mistake, not the file's).
func ParseSafetensorsHeader(path string, data []byte, fileSize int64) (*SafetensorsHeader, error) {
	if fileSize < 8 {
		return nil, corrupt(path, "", -1, "not a safetensors file: %d bytes", fileSize)
	}
	if len(data) < 8 {
		return nil, fmt.Errorf("%w: safetensors: %d bytes given of a header", gds.ErrInvalid, len(data))
	}
	n := binary.LittleEndian.Uint64(data)
	if n > safetensorsMaxHeader || int64(n) > fileSize-8 {
		return nil, corrupt(path, "", 0, "safetensors: header length %d does not fit a file of %d bytes (the format allows at most %d)",
			n, fileSize, safetensorsMaxHeader)
	}
	start := 8 + int64(n)
	if int64(len(data)) < start {
		return nil, fmt.Errorf("%w: safetensors: %d bytes given of a %d-byte header", gds.ErrInvalid, len(data), start)
	}
	p := stParser{path: path, text: data[8:start]}
	h, err := p.parse()
	if err != nil {
		return nil, err
	}
	h.DataStart = start
	if err := checkSpans(path, h, fileSize); err != nil {
		return nil, err
	}
	return h, nil
}

// stParser parses a safetensors header's JSON.
type stParser struct {
	path string
	text []byte
	dec  *json.Decoder
}

// errorAt is a corruption error about record (a tensor's name, or "") at
// the header's byte pos.
func (p *stParser) errorAt(record string, pos int64, format string, args ...any) error {
	return corrupt(p.path, record, 8+pos, "safetensors header: "+format, args...)
}

func (p *stParser) parse() (*SafetensorsHeader, error) {
	if !utf8.Valid(p.text) {
		return nil, p.errorAt("", 0, "not UTF-8 text")
	}
	p.dec = json.NewDecoder(bytes.NewReader(p.text))
	if tok, err := p.dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, p.errorAt("", 0, "not a JSON object")
	}
	h := &SafetensorsHeader{Tensors: []SafetensorsEntry{}}
	seen := map[string]bool{}
	for p.dec.More() {
		pos := p.dec.InputOffset()
		tok, err := p.dec.Token()
		if err != nil {
			return nil, p.errorAt("", pos, "not valid JSON: %v", err)
		}
		name, _ := tok.(string) // More and Token see to a key in an object
		if seen[name] {
			return nil, p.errorAt(name, pos, "%q appears twice", name)
		}
		seen[name] = true
		var raw json.RawMessage
		if err := p.dec.Decode(&raw); err != nil {
			return nil, p.errorAt(name, pos, "not valid JSON: %v", err)
		}
		if name == safetensorsMetaKey {
			if string(raw) != "null" && json.Unmarshal(raw, &h.Metadata) != nil {
				return nil, p.errorAt(name, pos, "%s is not an object of strings", safetensorsMetaKey)
			}
			continue
		}
		e, err := p.entry(name, raw, pos)
		if err != nil {
			return nil, err
		}
		h.Tensors = append(h.Tensors, e)
	}
	if _, err := p.dec.Token(); err != nil { // the closing brace
		return nil, p.errorAt("", p.dec.InputOffset(), "not valid JSON: %v", err)
	}
	// Only JSON whitespace may follow (our writer's padding is spaces).
	end := p.dec.InputOffset()
	if rest := bytes.TrimLeft(p.text[end:], " \t\r\n"); len(rest) > 0 {
		return nil, p.errorAt("", int64(len(p.text)-len(rest)), "%d bytes that are not JSON whitespace follow the object", len(rest))
	}
	return h, nil
}

// entry parses the header entry of tensor name (raw, at the header's byte
// pos) with its data_offsets relative to the data region.
func (p *stParser) entry(name string, raw json.RawMessage, pos int64) (SafetensorsEntry, error) {
	fail := func(format string, args ...any) (SafetensorsEntry, error) {
		return SafetensorsEntry{}, p.errorAt(name, pos, format, args...)
	}
	var fields map[string]json.RawMessage
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &fields) != nil {
		return fail("entry is not a JSON object")
	}
	var dtype string
	if f, ok := fields["dtype"]; !ok || len(f) == 0 || f[0] != '"' || json.Unmarshal(f, &dtype) != nil {
		return fail("no dtype string")
	}
	bits, ok := safetensorsItemBits[dtype]
	if !ok {
		return SafetensorsEntry{}, fmt.Errorf("%w: %s: tensor %q: unknown dtype %q (a newer safetensors format?)",
			ErrUnknownDType, p.path, name, dtype)
	}
	shape, ok := intArray(fields["shape"])
	if !ok {
		return fail("shape is not a list of integers")
	}
	offs, ok := intArray(fields["data_offsets"])
	if !ok || len(offs) != 2 {
		return fail("data_offsets is not a list of two integers")
	}
	b, e := offs[0], offs[1]
	n, ok := shapeBytes(shape, bits)
	if !ok || b < 0 || e < b || e-b != n {
		return fail("data_offsets %d..%d do not match shape %v of %s", b, e, shape, dtype)
	}
	return SafetensorsEntry{Name: name, DType: dtype, Shape: shape, Begin: b, End: e}, nil
}

// intArray returns raw as a JSON array of integers (no fractions, no
// exponents, no quotes: what fits an int64 as JSON writes it), and false
// when it is not one.
func intArray(raw json.RawMessage) ([]int64, bool) {
	var items []json.RawMessage
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &items) != nil {
		return nil, false
	}
	out := make([]int64, len(items))
	for i, it := range items {
		v, err := strconv.ParseInt(string(it), 10, 64)
		if err != nil {
			return nil, false
		}
		out[i] = v
	}
	return out, true
}

// checkSpans checks that the tensors of h, their offsets relative to the
// data region, fill it exactly up to fileSize, and makes the offsets
// absolute.
func checkSpans(path string, h *SafetensorsHeader, fileSize int64) error {
	order := make([]int, len(h.Tensors))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		ta, tb := &h.Tensors[a], &h.Tensors[b]
		return cmp.Or(cmp.Compare(ta.Begin, tb.Begin), cmp.Compare(ta.End, tb.End), cmp.Compare(ta.Name, tb.Name))
	})
	region := fileSize - h.DataStart
	var pos int64
	for _, i := range order {
		t := &h.Tensors[i]
		if t.Begin != pos {
			what := "a hole before it"
			if t.Begin < pos {
				what = "it overlaps the tensor before it"
			}
			off := h.DataStart + min(t.Begin, region)
			return corrupt(path, t.Name, off, "safetensors: tensor starts at %d of the data region, expected %d: %s",
				t.Begin, pos, what)
		}
		pos = t.End
	}
	if pos != region {
		what := ""
		if pos > region {
			what = " (truncated)"
		}
		return corrupt(path, "", fileSize, "safetensors: data region is %d bytes, the header describes %d%s", region, pos, what)
	}
	for i := range h.Tensors {
		h.Tensors[i].Begin += h.DataStart
		h.Tensors[i].End += h.DataStart
	}
	return nil
}
