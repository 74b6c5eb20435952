package checkpoint

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A safetensors file staged tensor by tensor (some staged, in parts, some
// from memory) is the file SaveSafetensors writes.
func TestStagedSafetensorsIsByteIdenticalToSaveSafetensors(t *testing.T) {
	dir := t.TempDir()
	tensors := []STensor{
		{Name: "w", DType: "F32", Shape: []int64{1250}, Size: 5000, Data: bytes.Repeat([]byte("a"), 5000)},
		{Name: "tiny", DType: "U8", Shape: []int64{4}, Size: 4, Data: []byte("tiny")},
		{Name: "b", DType: "F16", Shape: []int64{4500}, Size: 9000, Data: bytes.Repeat([]byte("b"), 9000)},
		{Name: "none", DType: "F32", Shape: []int64{0}, Size: 0},
	}
	meta := []MetaEntry{{Key: "format", Value: "pt"}}
	want := filepath.Join(dir, "save.safetensors")
	_, err := SaveSafetensors(want, tensors, meta, WriteOptions{})
	require.NoError(t, err)

	staged := []bool{true, false, true, true}
	in := make([]STensor, len(tensors))
	for k, st := range tensors {
		in[k] = st
		if staged[k] {
			in[k].Data = nil
		}
	}
	got := filepath.Join(dir, "staged.safetensors")
	s, err := BeginStagedSafetensors(got, in, meta, staged, WriteOptions{})
	require.NoError(t, err)
	assert.ErrorIs(t, s.WriteParts([]Part{{Rec: 4, Data: []byte("x")}}), gds.ErrInvalid, "no tensor 4")
	assert.ErrorIs(t, s.WriteParts([]Part{{Rec: 1, Data: []byte("x")}}), gds.ErrInvalid, "tensor 1 is whole already")
	assert.ErrorIs(t, s.WriteParts([]Part{{Rec: 0, Off: 10, Data: []byte("x")}}), gds.ErrInvalid, "parts in order")
	require.NoError(t, s.WriteParts([]Part{{Rec: 0, Data: tensors[0].Data[:1000]}, {Rec: 2, Data: tensors[2].Data[:7]}}))
	require.NoError(t, s.WriteParts([]Part{{Rec: 2, Off: 7, Data: tensors[2].Data[7:]}, {Rec: 0, Off: 1000, Data: tensors[0].Data[1000:]}}))
	_, err = s.Commit()
	require.NoError(t, err)
	assertSameFile(t, want, got)
}

// A staged save committed before its staged tensors are whole, or
// aborted, leaves nothing at its path and no temporary file.
func TestStagedSafetensorsIncompleteOrAbortedLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.safetensors")
	in := []STensor{{Name: "w", DType: "U8", Shape: []int64{100}, Size: 100}}
	s, err := BeginStagedSafetensors(path, in, nil, []bool{true}, WriteOptions{})
	require.NoError(t, err)
	require.NoError(t, s.WriteParts([]Part{{Rec: 0, Data: make([]byte, 60)}}))
	_, err = s.Commit()
	assert.ErrorIs(t, err, gds.ErrInvalid)
	assert.ErrorContains(t, err, "span 0 has 60 of its 100 bytes")
	s, err = BeginStagedSafetensors(path, in, nil, []bool{true}, WriteOptions{})
	require.NoError(t, err)
	s.Abort()
	assert.ErrorIs(t, s.WriteParts([]Part{{Rec: 0, Data: []byte("x")}}), gds.ErrInvalid, "no part after an abort")
	left, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, left)
	_, err = BeginStagedSafetensors(path, []STensor{{Name: "w", DType: "U8", Shape: []int64{1}, Size: 1, Data: []byte("x")}},
		nil, []bool{true}, WriteOptions{})
	assert.ErrorIs(t, err, gds.ErrInvalid, "a staged tensor comes without data")
}
