package checkpoint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// fileOf returns the bytes of the file LayoutSafetensors lays out for
// tensors and metadata, each tensor's data filled with its Data (or zeros).
func fileOf(t testing.TB, tensors []STensor, metadata []MetaEntry) ([]byte, []int64) {
	t.Helper()
	header, offsets, size, err := LayoutSafetensors(tensors, metadata, transfer.Alignment)
	require.NoError(t, err)
	b := make([]byte, size)
	copy(b, header)
	for i, ts := range tensors {
		copy(b[offsets[i]:], ts.Data)
	}
	return b, offsets
}

func TestLayoutSafetensorsWritesWhatTheSafetensorsPackageWrites(t *testing.T) {
	tensors := []STensor{
		{Name: "b", DType: "I8", Shape: []int64{2}, Size: 2},
		{Name: "a", DType: "F64", Shape: []int64{2}, Size: 16},
		{Name: "é😀\"\\\n\x01\x7f\u2028<&>", DType: "F32", Shape: []int64{}, Size: 4},
		{Name: "z", DType: "F32", Shape: []int64{0, 3}, Size: 0},
		{Name: "y", DType: "I32", Shape: []int64{1}, Size: 4},
	}
	meta := []MetaEntry{{"z", "1"}, {"a", "x\ty"}}
	header, offsets, size, err := LayoutSafetensors(tensors, meta, transfer.Alignment)
	require.NoError(t, err)
	// What safetensors.torch.save writes for the same tensors (0.8): by the
	// package's dtype order (F64, then F32 before I32 though both are 32
	// bits, then I8), then by name, byte-wise; metadata in the caller's
	// order; serde_json's escapes (control characters only), UTF-8 as it is.
	want := `{"__metadata__":{"z":"1","a":"x\ty"},"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},` +
		`"z":{"dtype":"F32","shape":[0,3],"data_offsets":[16,16]},` +
		"\"é😀\\\"\\\\\\n\\u0001\x7f\u2028<&>\"" + `:{"dtype":"F32","shape":[],"data_offsets":[16,20]},` +
		`"y":{"dtype":"I32","shape":[1],"data_offsets":[20,24]},` +
		`"b":{"dtype":"I8","shape":[2],"data_offsets":[24,26]}}`
	require.Len(t, header, transfer.Alignment)
	assert.Equal(t, uint64(transfer.Alignment-8), binary.LittleEndian.Uint64(header))
	assert.Equal(t, want, string(header[8:8+len(want)]))
	assert.Equal(t, strings.Repeat(" ", transfer.Alignment-8-len(want)), string(header[8+len(want):]))
	a := int64(transfer.Alignment)
	assert.Equal(t, []int64{a + 24, a, a + 16, a + 16, a + 20}, offsets)
	assert.Equal(t, a+26, size)

	// The package's own alignment: the JSON padded to a multiple of 8 bytes.
	header, offsets, size, err = LayoutSafetensors(tensors, meta, SafetensorsPackageAlign)
	require.NoError(t, err)
	assert.Zero(t, len(header)%8)
	assert.Less(t, len(header), 8+len(want)+8)
	assert.Equal(t, string(header[8:8+len(want)]), want)
	assert.Equal(t, int64(len(header)), offsets[1])
	assert.Equal(t, int64(len(header))+26, size)

	// No metadata: no key; empty metadata: an empty object.
	header, _, _, err = LayoutSafetensors(nil, nil, transfer.Alignment)
	require.NoError(t, err)
	assert.Equal(t, "{}", strings.TrimRight(string(header[8:]), " "))
	header, _, _, err = LayoutSafetensors(nil, []MetaEntry{}, transfer.Alignment)
	require.NoError(t, err)
	assert.Equal(t, `{"__metadata__":{}}`, strings.TrimRight(string(header[8:]), " "))

	_, _, _, err = LayoutSafetensors(nil, nil, 12)
	require.ErrorIs(t, err, gds.ErrInvalid)
}

func TestSafetensorsFileAlignIsThePagesOnlyForLargeTensors(t *testing.T) {
	small := []STensor{{Name: "a", DType: "U8", Shape: []int64{transfer.DirectThreshold - 1}, Size: transfer.DirectThreshold - 1}}
	assert.Equal(t, int64(SafetensorsPackageAlign), SafetensorsFileAlign(small))
	assert.Equal(t, int64(SafetensorsPackageAlign), SafetensorsFileAlign(nil))
	large := append(small, STensor{Name: "b", DType: "U8", Shape: []int64{transfer.DirectThreshold}, Size: transfer.DirectThreshold})
	assert.Equal(t, int64(transfer.Alignment), SafetensorsFileAlign(large))
}

func TestLayoutSafetensorsAlignsTheDataRegion(t *testing.T) {
	for _, n := range []int{0, 1, 60, 61, 200} {
		var tensors []STensor
		for i := range n {
			tensors = append(tensors, STensor{Name: strings.Repeat("x", i), DType: "F16", Shape: []int64{3}, Size: 6})
		}
		header, offsets, size, err := LayoutSafetensors(tensors, nil, transfer.Alignment)
		require.NoError(t, err)
		assert.Zero(t, len(header)%transfer.Alignment, "%d tensors", n)
		assert.Equal(t, int64(len(header)+6*n), size)
		for _, off := range offsets {
			assert.GreaterOrEqual(t, off, int64(len(header)))
		}
	}
}

func TestLayoutSafetensorsRefusesInvalidTensors(t *testing.T) {
	ok := STensor{Name: "w", DType: "F32", Shape: []int64{2, 3}, Size: 24}
	with := func(f func(*STensor)) []STensor { s := ok; f(&s); return []STensor{s} }
	for name, c := range map[string]struct {
		tensors []STensor
		meta    []MetaEntry
		says    string
	}{
		"unknown dtype":      {with(func(s *STensor) { s.DType = "F7" }), nil, `unknown dtype "F7"`},
		"size not the shape": {with(func(s *STensor) { s.Size = 23 }), nil, "do not match shape"},
		"negative dimension": {with(func(s *STensor) { s.Shape = []int64{-2, -3} }), nil, "do not match shape"},
		"size overflows":     {with(func(s *STensor) { s.Shape = []int64{1 << 40, 1 << 40} }), nil, "do not match shape"},
		"reserved name":      {with(func(s *STensor) { s.Name = "__metadata__" }), nil, "cannot be called"},
		"not UTF-8":          {with(func(s *STensor) { s.Name = "\xff" }), nil, "not UTF-8"},
		"twice":              {[]STensor{ok, ok}, nil, `"w" appears twice`},
		"metadata twice":     {nil, []MetaEntry{{"k", "1"}, {"k", "2"}}, `key "k" appears twice`},
		"metadata not UTF-8": {nil, []MetaEntry{{"k", "\xc3"}}, "not UTF-8"},
	} {
		_, _, _, err := LayoutSafetensors(c.tensors, c.meta, transfer.Alignment)
		require.ErrorIs(t, err, gds.ErrInvalid, name)
		assert.Contains(t, err.Error(), c.says, name)
	}
}

func TestParseSafetensorsHeaderReadsWhatLayoutWrote(t *testing.T) {
	tensors := []STensor{
		{Name: "bias", DType: "BF16", Shape: []int64{3}, Size: 6, Data: []byte("bbbbbb")},
		{Name: "w", DType: "F32", Shape: []int64{2, 2}, Size: 16, Data: bytes.Repeat([]byte("w"), 16)},
		{Name: "none", DType: "U8", Shape: []int64{0}, Size: 0},
		{Name: "s", DType: "I64", Shape: []int64{}, Size: 8, Data: []byte("ssssssss")},
	}
	b, offsets := fileOf(t, tensors, []MetaEntry{{"format", "pt"}})
	h, err := ParseSafetensorsHeader("x.safetensors", b, int64(len(b)))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"format": "pt"}, h.Metadata)
	assert.Equal(t, int64(transfer.Alignment), h.DataStart)
	got := map[string]SafetensorsEntry{}
	var names []string
	for _, e := range h.Tensors {
		got[e.Name] = e
		names = append(names, e.Name)
	}
	assert.Equal(t, []string{"s", "w", "bias", "none"}, names, "the header's order")
	for i, ts := range tensors {
		e := got[ts.Name]
		assert.Equal(t, SafetensorsEntry{Name: ts.Name, DType: ts.DType, Shape: ts.Shape, Begin: offsets[i], End: offsets[i] + ts.Size}, e)
		assert.True(t, bytes.Equal(ts.Data, b[e.Begin:e.End]), ts.Name)
	}

	// Without metadata the map is nil; a header of no tensors has an empty list.
	b, _ = fileOf(t, nil, nil)
	h, err = ParseSafetensorsHeader("x.safetensors", b, int64(len(b)))
	require.NoError(t, err)
	assert.Nil(t, h.Metadata)
	assert.Equal(t, []SafetensorsEntry{}, h.Tensors)
}

func TestParseSafetensorsHeaderReadsTheSafetensorsPackagesFiles(t *testing.T) {
	// Written by safetensors.torch.save_file (0.8.0): keys sorted by dtype
	// size then name, 8-byte padding, raw UTF-8 in the metadata.
	b, err := os.ReadFile(filepath.Join("testdata", "st_small.safetensors"))
	require.NoError(t, err)
	h, err := ParseSafetensorsHeader("st_small.safetensors", b, int64(len(b)))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"format": "pt", "note": "é"}, h.Metadata)
	start := h.DataStart
	assert.Equal(t, []SafetensorsEntry{
		{Name: "ids", DType: "I64", Shape: []int64{2}, Begin: start, End: start + 16},
		{Name: "weight", DType: "F32", Shape: []int64{4, 3}, Begin: start + 16, End: start + 64},
		{Name: "bias", DType: "F16", Shape: []int64{3}, Begin: start + 64, End: start + 70},
		{Name: "flag", DType: "BOOL", Shape: []int64{2}, Begin: start + 70, End: start + 72},
	}, h.Tensors)
	assert.Equal(t, []byte{3, 0, 0, 0, 0, 0, 0, 0}, b[start:start+8])

	b, err = os.ReadFile(filepath.Join("testdata", "st_mixed.safetensors"))
	require.NoError(t, err)
	h, err = ParseSafetensorsHeader("st_mixed.safetensors", b, int64(len(b)))
	require.NoError(t, err)
	assert.Nil(t, h.Metadata)
	require.Len(t, h.Tensors, 7)
	assert.Equal(t, SafetensorsEntry{Name: "scalar", DType: "F64", Shape: []int64{}, Begin: h.DataStart, End: h.DataStart + 8}, h.Tensors[0])
}

// stFile is a safetensors file of the header text (padded to a multiple
// of 8 bytes with spaces) followed by data bytes.
func stFile(text string, data int) []byte {
	text += strings.Repeat(" ", (8-len(text)%8)%8)
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(text)))
	return append(append(b, text...), make([]byte, data)...)
}

func TestParseSafetensorsHeaderRefusesDamagedHeaders(t *testing.T) {
	entry := func(dtype, shape, offs string) string {
		return `{"t":{"dtype":` + dtype + `,"shape":` + shape + `,"data_offsets":` + offs + `}}`
	}
	good := entry(`"F32"`, "[2]", "[0,8]")
	_, err := ParseSafetensorsHeader("x", stFile(good, 8), int64(len(stFile(good, 8))))
	require.NoError(t, err)
	huge := binary.LittleEndian.AppendUint64(nil, 100_000_001)
	_, err = ParseSafetensorsHeader("x.safetensors", huge, 1<<40) // refused before any of the header is needed
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), "at most 100000000")
	for name, c := range map[string]struct {
		file   []byte
		record string
		says   string
	}{
		"empty file":           {nil, "", "not a safetensors file: 0 bytes"},
		"seven bytes":          {make([]byte, 7), "", "not a safetensors file: 7 bytes"},
		"length past the end":  {stFile(good, 8)[:40], "", "does not fit a file of 40 bytes"},
		"length over the cap":  {huge, "", "header length 100000001 does not fit"},
		"not JSON":             {stFile(`{"t":`, 0), "t", "not valid JSON"},
		"empty header":         {stFile(``, 0), "", "not a JSON object"},
		"a list":               {stFile(`[]`, 0), "", "not a JSON object"},
		"not UTF-8":            {stFile("{\"\xff\":1}", 0), "", "not UTF-8"},
		"trailing bytes":       {stFile(`{}x`, 0), "", "not JSON whitespace"},
		"two objects":          {stFile(`{}{}`, 0), "", "not JSON whitespace"},
		"entry not an object":  {stFile(`{"t":[1]}`, 0), "t", "entry is not a JSON object"},
		"entry null":           {stFile(`{"t":null}`, 0), "t", "entry is not a JSON object"},
		"no dtype":             {stFile(`{"t":{"shape":[],"data_offsets":[0,0]}}`, 0), "t", "no dtype"},
		"dtype not a string":   {stFile(entry(`4`, "[2]", "[0,8]"), 8), "t", "no dtype"},
		"dtype in other case":  {stFile(`{"t":{"DTYPE":"F32","shape":[2],"data_offsets":[0,8]}}`, 8), "t", "no dtype"},
		"odd count of F4":      {stFile(entry(`"F4"`, "[3]", "[0,2]"), 2), "t", "do not match shape [3] of F4"},
		"F6 not whole bytes":   {stFile(entry(`"F6_E3M2"`, "[2]", "[0,2]"), 2), "t", "do not match shape [2] of F6_E3M2"},
		"no shape":             {stFile(`{"t":{"dtype":"F32","data_offsets":[0,8]}}`, 8), "t", "shape is not a list"},
		"shape of strings":     {stFile(entry(`"F32"`, `["2"]`, "[0,8]"), 8), "t", "shape is not a list"},
		"shape of fractions":   {stFile(entry(`"F32"`, `[2.0]`, "[0,8]"), 8), "t", "shape is not a list"},
		"shape too large":      {stFile(entry(`"F32"`, `[1e30]`, "[0,8]"), 8), "t", "shape is not a list"},
		"negative dimension":   {stFile(entry(`"F32"`, `[-2]`, "[0,8]"), 8), "t", "do not match shape"},
		"overflowing shape":    {stFile(entry(`"F32"`, `[4294967296,4294967296]`, "[0,8]"), 8), "t", "do not match shape"},
		"one offset":           {stFile(entry(`"F32"`, "[2]", "[8]"), 8), "t", "data_offsets is not a list of two"},
		"three offsets":        {stFile(entry(`"F32"`, "[2]", "[0,8,9]"), 8), "t", "data_offsets is not a list of two"},
		"offsets reversed":     {stFile(entry(`"F32"`, "[0]", "[8,0]"), 8), "t", "do not match shape"},
		"negative offset":      {stFile(entry(`"F32"`, "[2]", "[-8,0]"), 8), "t", "do not match shape"},
		"size not the shape":   {stFile(entry(`"F32"`, "[3]", "[0,8]"), 8), "t", "data_offsets 0..8 do not match shape [3] of F32"},
		"tensor twice":         {stFile(`{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1), "t", "appears twice"},
		"metadata not strings": {stFile(`{"__metadata__":{"a":1}}`, 0), "__metadata__", "not an object of strings"},
		"metadata a list":      {stFile(`{"__metadata__":["a"]}`, 0), "__metadata__", "not an object of strings"},
		"hole": {stFile(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}}`, 3),
			"b", "starts at 2 of the data region, expected 1: a hole"},
		"overlap": {stFile(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2),
			"b", "expected 2: it overlaps"},
		"truncated":   {stFile(good, 7), "", "data region is 7 bytes, the header describes 8 (truncated)"},
		"extra bytes": {stFile(good, 9), "", "data region is 9 bytes, the header describes 8"},
		"far offsets": {stFile(entry(`"U8"`, "[1]", "[9223372036854775806,9223372036854775807]"), 8), "t", "starts at 9223372036854775806"},
	} {
		h, err := ParseSafetensorsHeader("x.safetensors", c.file, int64(len(c.file)))
		assert.Nil(t, h, name)
		var ce *CorruptError
		require.ErrorIs(t, err, ErrCorrupt, name)
		require.True(t, errors.As(err, &ce), name)
		assert.Equal(t, "x.safetensors", ce.Path, name)
		assert.Equal(t, c.record, ce.Record, name)
		assert.Contains(t, ce.Reason, c.says, name)
	}

	// Data short of a header that fits the file is the caller's mistake.
	b := stFile(good, 8)
	_, err = ParseSafetensorsHeader("x", b[:20], int64(len(b)))
	require.ErrorIs(t, err, gds.ErrInvalid)
	_, err = ParseSafetensorsHeader("x", b[:5], int64(len(b)))
	require.ErrorIs(t, err, gds.ErrInvalid)
}

func TestParseSafetensorsHeaderReadsEveryDTypeOfTheFormat(t *testing.T) {
	// Each dtype of the safetensors package's Rust core (0.8) and its size:
	// F8_E8M0 (MXFP8 scales) a byte, F4 two to a byte, F6 four to three.
	for dtype, c := range map[string]struct {
		shape string
		size  int
	}{
		"F64": {"[2]", 16}, "F32": {"[2]", 8}, "F16": {"[2]", 4}, "BF16": {"[2]", 4},
		"I64": {"[2]", 16}, "I32": {"[2]", 8}, "I16": {"[2]", 4}, "I8": {"[2]", 2},
		"U64": {"[2]", 16}, "U32": {"[2]", 8}, "U16": {"[2]", 4}, "U8": {"[2]", 2},
		"BOOL": {"[2]", 2}, "C64": {"[2]", 16},
		"F8_E4M3": {"[2]", 2}, "F8_E5M2": {"[2]", 2}, "F8_E4M3FNUZ": {"[2]", 2}, "F8_E5M2FNUZ": {"[2]", 2},
		"F8_E8M0": {"[3]", 3}, "F4": {"[2,6]", 6}, "F6_E2M3": {"[4]", 3}, "F6_E3M2": {"[2,4]", 6},
	} {
		text := `{"t":{"dtype":"` + dtype + `","shape":` + c.shape + `,"data_offsets":[0,` + strconv.Itoa(c.size) + `]}}`
		b := stFile(text, c.size)
		h, err := ParseSafetensorsHeader("x.safetensors", b, int64(len(b)))
		require.NoError(t, err, dtype)
		require.Len(t, h.Tensors, 1, dtype)
		assert.Equal(t, dtype, h.Tensors[0].DType)
		assert.Equal(t, int64(c.size), h.Tensors[0].End-h.Tensors[0].Begin, dtype)
	}
	// Our writer lays them out too: by element size, largest first.
	tensors := []STensor{
		{Name: "q", DType: "F4", Shape: []int64{2, 4}, Size: 4},
		{Name: "scale", DType: "F8_E8M0", Shape: []int64{3}, Size: 3},
		{Name: "q6", DType: "F6_E2M3", Shape: []int64{4}, Size: 3},
	}
	b, offsets := fileOf(t, tensors, nil)
	a := int64(transfer.Alignment)
	assert.Equal(t, []int64{a + 6, a, a + 3}, offsets)
	h, err := ParseSafetensorsHeader("x.safetensors", b, int64(len(b)))
	require.NoError(t, err)
	assert.Equal(t, []string{"scale", "q6", "q"}, []string{h.Tensors[0].Name, h.Tensors[1].Name, h.Tensors[2].Name})
	_, _, _, err = LayoutSafetensors([]STensor{{Name: "q", DType: "F4", Shape: []int64{3}, Size: 2}}, nil, transfer.Alignment)
	require.ErrorIs(t, err, gds.ErrInvalid)
	assert.Contains(t, err.Error(), "do not match shape [3] of F4")
}

func TestParseSafetensorsHeaderCallsAnUnknownDTypeUnsupported(t *testing.T) {
	// A dtype this build does not know may come from a newer format: the
	// file is not called corrupt, and the error names the file, the tensor
	// and the dtype.
	b := stFile(`{"ok":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"F3_NEW","shape":[2],"data_offsets":[1,2]}}`, 2)
	h, err := ParseSafetensorsHeader("dir/x.safetensors", b, int64(len(b)))
	assert.Nil(t, h)
	require.ErrorIs(t, err, ErrUnknownDType)
	require.ErrorIs(t, err, gds.ErrUnsupported)
	assert.NotErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), `dir/x.safetensors: tensor "w": unknown dtype "F3_NEW"`)

	path := filepath.Join(t.TempDir(), "new.safetensors")
	require.NoError(t, os.WriteFile(path, b, 0o600))
	_, err = OpenSafetensors(path)
	require.ErrorIs(t, err, gds.ErrUnsupported)
	assert.Contains(t, err.Error(), path)
}

func TestSaveAndOpenSafetensors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	old := []STensor{
		{Name: "big", DType: "F32", Shape: []int64{300_000}, Size: 1_200_000, Data: testutil.Pattern(1_200_000, 1)},
		{Name: "small", DType: "I16", Shape: []int64{3, 1}, Size: 6, Data: testutil.Pattern(6, 2)},
		{Name: "empty", DType: "F64", Shape: []int64{0}, Size: 0},
	}
	st, err := SaveSafetensors(path, old, []MetaEntry{{"format", "pt"}}, WriteOptions{NotDurable: true})
	require.NoError(t, err)
	want, _ := fileOf(t, old, []MetaEntry{{"format", "pt"}})
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, want, got, "the file is its layout")
	assert.Equal(t, int64(len(want)), st.FileBytes)

	f, err := OpenSafetensors(path)
	require.NoError(t, err)
	defer f.Close()
	assert.Equal(t, int64(len(want)), f.Size)
	assert.Equal(t, map[string]string{"format": "pt"}, f.Metadata)
	assert.GreaterOrEqual(t, f.Fd, 0)

	// A save replacing the file (a rename) does not change what the open
	// file reads.
	_, err = SaveSafetensors(path, []STensor{{Name: "other", DType: "U8", Shape: []int64{5}, Size: 5, Data: []byte("other")}},
		nil, WriteOptions{NotDurable: true})
	require.NoError(t, err)
	src, err := f.Source()
	require.NoError(t, err)
	var exts []Extent
	for _, e := range f.Tensors {
		exts = append(exts, Extent{Off: e.Begin, Data: make([]byte, e.End-e.Begin)})
	}
	_, err = ReadRaw(src, exts, ReadOptions{})
	require.NoError(t, err)
	for i, e := range f.Tensors {
		for _, o := range old {
			if o.Name == e.Name {
				assert.Equal(t, len(o.Data), len(exts[i].Data), e.Name)
				assert.True(t, bytes.Equal(o.Data, exts[i].Data), e.Name)
			}
		}
	}
	require.NoError(t, f.Close())
	require.NoError(t, f.Close(), "idempotent")
	_, err = f.Source()
	require.ErrorIs(t, err, gds.ErrClosed)
}

func TestOpenSafetensorsRefusesDamagedFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	_, err := SaveSafetensors(path, []STensor{{Name: "w", DType: "F32", Shape: []int64{4}, Size: 16, Data: make([]byte, 16)}},
		nil, WriteOptions{NotDurable: true})
	require.NoError(t, err)
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(path, st.Size()-6)) // 10 of the tensor's 16 bytes left
	_, err = OpenSafetensors(path)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), "truncated")
	require.NoError(t, os.WriteFile(path, bytes.Repeat([]byte{0xff}, 16), 0o600))
	_, err = OpenSafetensors(path)
	require.ErrorIs(t, err, ErrCorrupt)
	require.NoError(t, os.WriteFile(path, []byte("abc"), 0o600))
	_, err = OpenSafetensors(path)
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = OpenSafetensors(filepath.Join(dir, "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestSaveSafetensorsRefusesDataOfTheWrongSize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	_, err := SaveSafetensors(path, []STensor{{Name: "w", DType: "F32", Shape: []int64{4}, Size: 16, Data: make([]byte, 15)}},
		nil, WriteOptions{NotDurable: true})
	require.ErrorIs(t, err, gds.ErrInvalid)
	_, err = os.Stat(path)
	require.ErrorIs(t, err, os.ErrNotExist, "nothing written")
}
