package loader

import (
	"bytes"
	"errors"
	"testing"
)

// Fuzz test of the index parser. The property: it never panics or hangs
// (every count is checked against the bytes before anything is allocated
// from it), and either returns an error that wraps ErrCorrupt (a
// *CorruptError naming the file and what is wrong) or ErrVersion (a
// *VersionError), or an index that encodes back to the very same bytes.
//
// With fix set, the input's trailer is first replaced by the CRC-32 of the
// rest, so that mutations reach the checks behind the checksum.

const fuzzIndexName = "fuzz/index.pfi"

func FuzzParseIndex(f *testing.F) {
	small := smallIndex(f)
	_, p := newPack(f, datasetOpts{n: 40, classes: 5, maxSize: 100, seed: 12}, 7)
	larger := encodeIndex(p.Index)
	_, p = newPack(f, datasetOpts{n: 3, classes: 1, maxSize: 0, seed: 13}, 1)
	empty := encodeIndex(p.Index)
	for _, b := range [][]byte{small, larger, empty} {
		f.Add(b, false)
		f.Add(b[:len(b)-1], false) // cut
		f.Add(b[:len(b)/2], true)  // cut, checksum fixed
		f.Add(b[:indexHeaderSize+4], true)
		m := bytes.Clone(b)
		m[len(m)/3] ^= 0x40
		f.Add(m, false) // a flipped bit
		f.Add(m, true)  // a flipped bit behind a good checksum
		v := bytes.Clone(b)
		v[8] = 9
		f.Add(v, false) // a newer version
	}
	f.Add([]byte{}, false)
	f.Add([]byte(indexMagic), true)
	f.Fuzz(func(t *testing.T, data []byte, fix bool) {
		if fix {
			data = reCRC(data)
		}
		ix, err := ParseIndex(fuzzIndexName, data)
		if err != nil {
			var ce *CorruptError
			var ve *VersionError
			switch {
			case ix != nil:
				t.Fatalf("an index and an error: %v", err)
			case errors.As(err, &ce):
				if !errors.Is(err, ErrCorrupt) || ce.Path != fuzzIndexName || ce.Reason == "" {
					t.Fatalf("a corrupt index's error does not say where or what: %v", err)
				}
			case errors.As(err, &ve):
				if !errors.Is(err, ErrVersion) || ve.Path != fuzzIndexName || ve.Found <= FormatVersion {
					t.Fatalf("a version error that is not one: %v", err)
				}
			default:
				t.Fatalf("error is neither ErrCorrupt nor ErrVersion: %v", err)
			}
			return
		}
		if again := encodeIndex(ix); !bytes.Equal(again, data) {
			t.Fatalf("a parsed index encodes to other bytes (%d, %d)", len(again), len(data))
		}
	})
}
