package checkpoint

import (
	"bytes"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/pyfastensor/pyfastensor/transfer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ringPlan packs the storage records of a (every record but the first and
// the last of sampleRecords, the empty one left out) into fills of slots
// of slotBytes, as a CUDA load does: records that fit share a slot, each
// on its own page; larger ones go in slot-sized parts. Fill k is in slot
// k % slots.
func ringPlan(a *Archive, slotBytes int64, slots int) (fillSlots []int, parts []RingPart) {
	fill, at := -1, slotBytes // no open fill
	next := func() {
		fill++
		fillSlots = append(fillSlots, fill%slots)
		at = 0
	}
	for i := 1; i < len(a.Entries)-1; i++ {
		size := a.Entries[i].Size
		if size == 0 {
			continue
		}
		if size > slotBytes {
			for off := int64(0); off < size; off += slotBytes {
				next()
				parts = append(parts, RingPart{Fill: fill, Rec: i, Off: off, Len: min(slotBytes, size-off)})
				at = slotBytes
			}
			continue
		}
		at = (at + DataAlign - 1) / DataAlign * DataAlign
		if at+size > slotBytes {
			next()
		}
		parts = append(parts, RingPart{Fill: fill, Rec: i, Len: size, At: at})
		at += size
	}
	return fillSlots, parts
}

func openSample(t *testing.T) (string, []Record, *Archive) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ck.pt")
	recs := sampleRecords()
	_, err := Save(path, recs, WriteOptions{})
	require.NoError(t, err)
	a, err := OpenArchive(path)
	require.NoError(t, err)
	t.Cleanup(func() { a.Close() })
	return path, recs, a
}

func ringSlots(n int, size int64) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = gds.AlignedBuf(int(size), gds.DirectAlign)
	}
	return out
}

// Every record comes out of the slots whole, through fewer slots than
// fills, each fill taken in order and its slot released after.
func TestRingReadDeliversEveryRecordThroughReusedSlots(t *testing.T) {
	_, recs, a := openSample(t)
	const slotBytes = 1 << 20
	for _, o := range []ReadOptions{{}, {NoVerify: true}} {
		fillSlots, parts := ringPlan(a, slotBytes, 3)
		require.Greater(t, len(fillSlots), 6, "more fills than slots")
		slots := ringSlots(3, slotBytes)
		r, err := a.StartRing(slots, fillSlots, parts, o)
		require.NoError(t, err)
		got := map[int][]byte{}
		release := -1
		for want := 0; ; want++ {
			k, err := r.Next(release)
			require.NoError(t, err)
			if k < 0 {
				assert.Equal(t, len(fillSlots), want, "every fill, then -1")
				break
			}
			require.Equal(t, want, k, "fills in order")
			for _, p := range parts {
				if p.Fill == k {
					got[p.Rec] = append(got[p.Rec], slots[fillSlots[k]][p.At:p.At+p.Len]...)
				}
			}
			release = k
		}
		require.NoError(t, r.Close())
		for i := 1; i < len(recs)-1; i++ {
			if len(recs[i].Data) > 0 {
				assert.True(t, bytes.Equal(recs[i].Data, got[i]), recs[i].Name)
			}
		}
	}
}

// A corrupt record fails the Next that completes it, naming it; Close
// returns after it, with nothing left reading.
func TestRingReadCatchesACorruptRecordAtItsLastPart(t *testing.T) {
	path, recs, a := openSample(t)
	big := len(recs) - 2 // larger than a slot: read in parts
	off := a.Entries[big].DataOff + int64(len(recs[big].Data)) - 3
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{0xff ^ recs[big].Data[len(recs[big].Data)-3]}, off)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	r := startSampleRing(t, a)
	err = takeAll(t, r)
	assert.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorContains(t, err, recs[big].Name)
	assert.NoError(t, r.Close(), "the reads themselves went well")
}

// A read that fails (the file cut short under the open archive) reaches
// Next as an error naming the record, even with pieces of later fills
// waiting for slots the caller has not released; Close returns.
func TestRingReadFailureReachesNextAndFreesWaitingPieces(t *testing.T) {
	path, recs, a := openSample(t)
	big := len(recs) - 2
	require.NoError(t, os.Truncate(path, a.Entries[big].DataOff+gds.DefaultTaskSize))
	r := startSampleRing(t, a)
	err := takeAll(t, r)
	assert.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorContains(t, err, "file ends inside the record's data")
	assert.ErrorContains(t, err, recs[big].Name)
	assert.ErrorIs(t, r.Close(), ErrCorrupt, "Close reports the failure too")
}

// startSampleRing starts reading a's records through 2 slots of 1 MiB.
func startSampleRing(t *testing.T, a *Archive) *RingRead {
	t.Helper()
	fillSlots, parts := ringPlan(a, 1<<20, 2)
	r, err := a.StartRing(ringSlots(2, 1<<20), fillSlots, parts, ReadOptions{})
	require.NoError(t, err)
	return r
}

// takeAll takes every fill, releasing each in the next call, and returns
// the first error; it fails the test if every fill came.
func takeAll(t *testing.T, r interface{ Next(int) (int, error) }) error {
	t.Helper()
	release := -1
	for {
		k, err := r.Next(release)
		if err != nil {
			return err
		}
		require.GreaterOrEqual(t, k, 0, "every fill was delivered")
		release = k
	}
}

// Closing in the middle stops the read: pieces waiting for a slot give up,
// those in flight land, and Close returns; Next after it fails.
func TestRingReadClosesMidway(t *testing.T) {
	_, _, a := openSample(t)
	r := startSampleRing(t, a)
	k, err := r.Next(-1)
	require.NoError(t, err)
	require.Equal(t, 0, k)
	require.NoError(t, r.Close(), "closed, not failed")
	require.NoError(t, r.Close(), "idempotent")
	_, err = r.Next(0)
	assert.Error(t, err)
}

// Waiting for a fill whose slot is still held by the caller would wait
// forever: Next refuses, naming what to release.
func TestRingReadRefusesToWaitForAHeldSlot(t *testing.T) {
	_, _, a := openSample(t)
	r := startSampleRing(t, a)
	defer r.Close()
	_, err := r.Next(-1)
	require.NoError(t, err)
	_, err = r.Next(-1) // fill 1, slot 1: free
	require.NoError(t, err)
	_, err = r.Next(-1) // fill 2 needs slot 0, which fill 0 holds
	assert.ErrorIs(t, err, gds.ErrInvalid)
	assert.ErrorContains(t, err, "fill 2 needs slot 0, which fill 0 still holds")
	_, err = r.Next(5)
	assert.ErrorIs(t, err, gds.ErrInvalid, "a fill not taken yet")
	k, err := r.Next(0)
	require.NoError(t, err)
	assert.Equal(t, 2, k)
	_, err = r.Next(0)
	assert.ErrorContains(t, err, "released already")
}

func TestRingReadRefusesBadPlans(t *testing.T) {
	_, recs, a := openSample(t)
	big := len(recs) - 2
	slots := ringSlots(2, 1<<20)
	for name, c := range map[string]struct {
		fills []int
		parts []RingPart
		want  string
	}{
		"slot out of range":   {[]int{2}, []RingPart{{Fill: 0, Rec: 2, Len: 1}}, "fill 0 in slot 2 of 2"},
		"fill out of order":   {[]int{0, 1}, []RingPart{{Fill: 1, Rec: 2, Len: 1}, {Fill: 0, Rec: 3, Len: 4095}}, "part 1 of fill 0, after fill 1"},
		"record not whole":    {[]int{0}, []RingPart{{Fill: 0, Rec: big, Len: 1 << 20}}, "parts of 1048576 of its"},
		"parts out of order":  {[]int{0, 1}, []RingPart{{Fill: 0, Rec: big, Off: 1 << 20, Len: 1 << 20}, {Fill: 1, Rec: big, Len: 1 << 20}}, "part at 1048576 after 0"},
		"past the slot":       {[]int{0}, []RingPart{{Fill: 0, Rec: 3, Len: 4095, At: 1<<20 - 100}}, "in a slot of 1048576"},
		"past the record":     {[]int{0}, []RingPart{{Fill: 0, Rec: 2, Len: 2}}, "has 1 bytes, part of 2 at 0"},
		"empty part":          {[]int{0}, []RingPart{{Fill: 0, Rec: 2, Len: 0}}, "part 0 of 0 bytes"},
		"record out of range": {[]int{0}, []RingPart{{Fill: 0, Rec: 99, Len: 1}}, "record index 99 out of range"},
	} {
		_, err := a.StartRing(slots, c.fills, c.parts, ReadOptions{})
		assert.ErrorIs(t, err, gds.ErrInvalid, name)
		assert.ErrorContains(t, err, c.want, name)
	}
	// Nothing was left holding the archive: it closes.
	assert.NoError(t, a.Close())
}

// The reads run ahead of the caller into every free slot: with a slot per
// fill, all of them land before the first Next.
func TestRingReadRunsAheadIntoFreeSlots(t *testing.T) {
	_, _, a := openSample(t)
	fillSlots, parts := ringPlan(a, 1<<20, 1<<10)
	var want int64
	for _, p := range parts {
		want += p.Len
	}
	landed := make(chan struct{})
	var got atomic.Int64
	o := ReadOptions{Progress: func(n int64) {
		if got.Add(n) == want {
			close(landed)
		}
	}}
	r, err := a.StartRing(ringSlots(len(fillSlots), 1<<20), fillSlots, parts, o)
	require.NoError(t, err)
	<-landed // every fill, with no Next yet (a hang here fails the test at go test's timeout)
	for k := range fillSlots {
		got, err := r.Next(-1)
		require.NoError(t, err)
		assert.Equal(t, k, got)
	}
	require.NoError(t, r.Close())
}

// A raw ring (a safetensors file's tensors) delivers the file's bytes
// through reused slots; a file cut short is ErrCorrupt naming the offset.
func TestRawRingReadsExtentsAndCatchesATruncatedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "raw")
	data := testutil.Pattern(5<<20+77, 9)
	require.NoError(t, os.WriteFile(path, data, 0o644))
	var fillSlots []int
	var exts []transfer.RingExtent
	for off, k := int64(0), 0; off < int64(len(data)); off, k = off+1<<20, k+1 {
		fillSlots = append(fillSlots, k%2)
		exts = append(exts, transfer.RingExtent{Fill: k, Off: off, Len: min(1<<20, int64(len(data))-off)})
	}
	slots := ringSlots(2, 1<<20)
	r, err := StartRawRing(path, slots, fillSlots, exts, ReadOptions{})
	require.NoError(t, err)
	var got []byte
	release := -1
	for {
		k, err := r.Next(release)
		require.NoError(t, err)
		if k < 0 {
			break
		}
		got = append(got, slots[fillSlots[k]][:exts[k].Len]...)
		release = k
	}
	require.NoError(t, r.Close())
	assert.True(t, bytes.Equal(data, got))

	require.NoError(t, os.Truncate(path, 3<<20+5))
	r, err = StartRawRing(path, slots, fillSlots, exts, ReadOptions{})
	require.NoError(t, err)
	err = takeAll(t, r)
	assert.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorContains(t, err, "file ends before the 1048576 bytes expected here")
	assert.ErrorIs(t, r.Close(), ErrCorrupt)
}
