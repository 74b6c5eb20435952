package checkpoint

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// FuzzReadDCP: the records and ranges a read takes come from a checkpoint's
// metadata, which a damaged or hostile file may fill with anything. Whatever
// they say, ReadDCP never panics, and a read it lets through returns the
// file's bytes at the places named (a record whose sums do not match them
// is an error, not wrong bytes).
func FuzzReadDCP(f *testing.F) {
	rng := rand.New(rand.NewPCG(9, 10))
	items := dcpItems(rng, 10_000, 5000, 1)
	path := filepath.Join(f.TempDir(), "__0_0.pfd")
	recs, _, err := SaveDCP(path, items, WriteOptions{})
	if err != nil {
		f.Fatal(err)
	}
	file, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	seed := func(r DCPRecord, off, n int64) []byte {
		b := binary.LittleEndian.AppendUint64(nil, uint64(r.Offset))
		b = binary.LittleEndian.AppendUint64(b, uint64(r.Length))
		b = binary.LittleEndian.AppendUint32(b, r.CRC)
		b = binary.LittleEndian.AppendUint64(b, uint64(off))
		b = binary.LittleEndian.AppendUint64(b, uint64(n))
		return append(b, r.Pages...)
	}
	f.Add(seed(recs[0], 0, recs[0].Length))
	f.Add(seed(recs[0], 4000, 3000))
	f.Add(seed(recs[1], 1, 4095))
	f.Add(seed(recs[2], 0, 1))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 36 {
			return
		}
		le := binary.LittleEndian
		r := DCPRecord{Name: "x", Offset: int64(le.Uint64(in)), Length: int64(le.Uint64(in[8:])), CRC: le.Uint32(in[16:]),
			Pages: in[36:]}
		off, n := int64(le.Uint64(in[20:])), int64(le.Uint64(in[28:]))
		if n < 0 || n > 1<<20 || r.Length > 1<<40 {
			return // a destination this large is the caller's memory, not the metadata's
		}
		dst := make([]byte, n)
		_, err := ReadDCP(path, []DCPRecord{r}, []DCPRange{{Record: 0, Off: off, Dst: dst}}, ReadOptions{})
		if err != nil {
			return
		}
		if n > 0 && !bytes.Equal(dst, file[r.Offset+off:r.Offset+off+n]) {
			t.Fatalf("read of [%d, %d) of a record at %d gave other bytes than the file's", off, off+n, r.Offset)
		}
	})
}
