package checkpoint

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/stretchr/testify/require"
)

// Fuzz test of the safetensors header parser. The property: it never
// panics or hangs, and either returns an error wrapping ErrCorrupt that
// says what is wrong, or a header whose tensors fill the data region
// exactly, each as large as its shape and dtype say, which our writer
// lays out again into a file that parses to the same tensors and metadata.

// stFuzzName is the path the fuzzed files are parsed as.
const stFuzzName = "fuzz.safetensors"

// safetensorsSeeds returns the seed corpus: files laid out by
// LayoutSafetensors (several tensors with metadata, one, none), files
// written by the safetensors package (testdata/), and damaged variants.
func safetensorsSeeds(f *testing.F) [][]byte {
	f.Helper()
	few, _ := fileOf(f, []STensor{
		{Name: "w", DType: "F32", Shape: []int64{2, 3}, Size: 24, Data: testutil.Pattern(24, 1)},
		{Name: "b", DType: "BF16", Shape: []int64{3}, Size: 6, Data: testutil.Pattern(6, 2)},
		{Name: "n", DType: "I64", Shape: []int64{}, Size: 8, Data: testutil.Pattern(8, 3)},
		{Name: "e", DType: "U8", Shape: []int64{0, 2}, Size: 0},
		{Name: "é", DType: "BOOL", Shape: []int64{1}, Size: 1, Data: []byte{1}},
	}, []MetaEntry{{"format", "pt"}, {"k", "v"}})
	one, _ := fileOf(f, []STensor{{Name: "x", DType: "F8_E5M2", Shape: []int64{4}, Size: 4, Data: []byte("abcd")}}, nil)
	none, _ := fileOf(f, nil, []MetaEntry{})
	// The dtypes of MXFP8 and FP4 checkpoints: an 8-bit exponent, and F4 elements two to a byte.
	subByte, _ := fileOf(f, []STensor{
		{Name: "scale", DType: "F8_E8M0", Shape: []int64{2}, Size: 2, Data: []byte{127, 128}},
		{Name: "q", DType: "F4", Shape: []int64{2, 4}, Size: 4, Data: testutil.Pattern(4, 4)},
		{Name: "q6", DType: "F6_E2M3", Shape: []int64{4}, Size: 3, Data: testutil.Pattern(3, 5)},
	}, nil)
	valid := [][]byte{unpadded(few), unpadded(one), unpadded(none), none, unpadded(subByte)}
	theirs, err := filepath.Glob(filepath.Join("testdata", "st_*.safetensors"))
	require.NoError(f, err)
	require.NotEmpty(f, theirs, "testdata holds files written by safetensors.torch.save_file")
	for _, path := range theirs {
		b, err := os.ReadFile(path)
		require.NoError(f, err)
		valid = append(valid, b)
	}
	for _, b := range valid {
		_, err := ParseSafetensorsHeader(stFuzzName, b, int64(len(b)))
		require.NoError(f, err, "every unharmed seed parses")
	}
	damaged := func(b []byte, off int, to byte) []byte {
		b = bytes.Clone(b)
		b[off] = to
		return b
	}
	small, err := os.ReadFile(filepath.Join("testdata", "st_small.safetensors"))
	require.NoError(f, err)
	text := int(binary.LittleEndian.Uint64(small)) + 8
	at := func(s string) int { return bytes.Index(small, []byte(s)) }
	return append(valid,
		small[:len(small)-1],                                             // the last tensor cut
		small[:text],                                                     // no data
		small[:text-1],                                                   // the header cut
		damaged(small, 0, small[0]+1),                                    // the header length
		damaged(small, 7, 1),                                             // a huge header length
		damaged(small, at(`"F32"`)+2, '6'),                               // a dtype: F62, unknown
		damaged(small, at(`[4,3]`)+1, '5'),                               // a shape
		damaged(small, at(`[16,64]`)+2, '7'),                             // an offset
		damaged(small, at(`"format"`), '['),                              // the metadata's syntax
		damaged(valid[0], 8+len("{"), ' '),                               // a key's quote
		damaged(valid[0], len(valid[0])-30, 0),                           // a data byte: still valid
		damaged(valid[4], bytes.Index(valid[4], []byte(`[2,4]`))+3, '3'), // F4 [2,3]: 3 bytes, not 4
		damaged(valid[4], bytes.Index(valid[4], []byte(`[4]`))+1, '5'),   // F6 [5]: 30 bits, not whole bytes
	)
}

// unpadded returns the safetensors file b with its header's padding cut
// to what keeps the data region on 8 bytes, as the safetensors package
// writes it: a seed of a few hundred bytes instead of 4 KiB, which the
// fuzzer mutates and minimizes much faster.
func unpadded(b []byte) []byte {
	n := binary.LittleEndian.Uint64(b)
	text := bytes.TrimRight(b[8:8+n], " ")
	text = append(bytes.Clone(text), bytes.Repeat([]byte{' '}, (8-len(text)%8)%8)...)
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(text)))
	return append(append(out, text...), b[8+n:]...)
}

func FuzzParseSafetensorsHeader(f *testing.F) {
	for _, b := range safetensorsSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		size := int64(len(data))
		h, err := ParseSafetensorsHeader(stFuzzName, data, size)
		if err != nil {
			if h != nil {
				t.Fatalf("a header with an error: %v", err)
			}
			if errors.Is(err, ErrUnknownDType) { // a dtype this build does not know: unsupported, not corrupt
				if errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), stFuzzName) || !strings.Contains(err.Error(), "unknown dtype") {
					t.Fatalf("an unknown dtype's error does not name the file and the dtype: %v", err)
				}
				return
			}
			var ce *CorruptError
			if !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) || ce.Reason == "" || ce.Path != stFuzzName {
				t.Fatalf("error does not wrap ErrCorrupt or say what is wrong (header %v): %v", h, err)
			}
			return
		}
		if h.DataStart != 8+int64(binary.LittleEndian.Uint64(data)) {
			t.Fatalf("data starts at %d", h.DataStart)
		}
		// The tensors fill [DataStart, size) exactly, each its shape's size.
		spans := slices.Clone(h.Tensors)
		slices.SortFunc(spans, func(a, b SafetensorsEntry) int { return cmp.Compare(a.Begin, b.Begin) })
		pos := h.DataStart
		for _, e := range spans {
			n, ok := shapeBytes(e.Shape, safetensorsItemBits[e.DType])
			if e.Begin != pos || !ok || e.End-e.Begin != n {
				t.Fatalf("tensor %q (%s %v) at %d..%d after %d", e.Name, e.DType, e.Shape, e.Begin, e.End, pos)
			}
			pos = e.End
		}
		if pos != size {
			t.Fatalf("tensors end at %d of %d bytes", pos, size)
		}
		// Our writer lays the same tensors out again, and they parse back.
		var tensors []STensor
		want := map[string]SafetensorsEntry{}
		for _, e := range h.Tensors {
			tensors = append(tensors, STensor{Name: e.Name, DType: e.DType, Shape: e.Shape, Size: e.End - e.Begin})
			want[e.Name] = SafetensorsEntry{Name: e.Name, DType: e.DType, Shape: e.Shape, End: e.End - e.Begin}
		}
		var meta []MetaEntry
		if h.Metadata != nil {
			meta = []MetaEntry{}
			for _, k := range slices.Sorted(maps.Keys(h.Metadata)) {
				meta = append(meta, MetaEntry{k, h.Metadata[k]})
			}
		}
		header, _, total, err := LayoutSafetensors(tensors, meta, SafetensorsPackageAlign)
		if err != nil {
			t.Fatalf("a parsed header does not lay out: %v", err)
		}
		again := append(header, make([]byte, total-int64(len(header)))...)
		h2, err := ParseSafetensorsHeader(stFuzzName, again, total)
		if err != nil {
			t.Fatalf("a laid-out header does not parse: %v", err)
		}
		got := map[string]SafetensorsEntry{}
		for _, e := range h2.Tensors {
			got[e.Name] = SafetensorsEntry{Name: e.Name, DType: e.DType, Shape: e.Shape, End: e.End - e.Begin}
		}
		require.Equal(t, want, got)
		require.Equal(t, h.Metadata, h2.Metadata)
	})
}
