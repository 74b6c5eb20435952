package loader

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// Packing a dataset, as the paper's section 3.2 generates chunks: shuffle
// the sample indices (a PCG seeded by the spec's seed), cut the shuffled
// sequence into chunks of N, write each chunk as one file of its samples
// back to back, padded to transfer.Alignment.
//
// The order of the writes is what makes an interrupted pack safe:
//
//  1. the index of an earlier pack in the directory is removed (and the
//     removal made durable): from here on the directory does not verify;
//  2. pack.plan, the spec's hash, is written durably, after the chunk
//     files of another spec are removed (a restart);
//  3. each chunk file is written (transfer.WriteFile, not durable: one
//     fsync pass at the end costs less than one per chunk), or kept when a
//     re-run of the same spec finds it present with the very bytes it
//     would write;
//  4. every chunk file is fsynced, then the directory once;
//  5. index.pfi is written last, durably.
//
// A crash anywhere before 5 leaves a directory without an index, which
// neither opens nor verifies; a re-run resumes at 3.

// PackStats describe a finished Pack.
type PackStats struct {
	Samples       int     `json:"samples"`
	Chunks        int     `json:"chunks"`
	ChunksWritten int     `json:"chunks_written"`
	ChunksKept    int     `json:"chunks_kept"`   // present from an interrupted run, byte for byte
	StaleRemoved  int     `json:"stale_removed"` // chunk files of another spec removed
	Resumed       bool    `json:"resumed"`       // the directory held a plan of the same spec
	DataBytes     int64   `json:"data_bytes"`    // the samples' bytes
	FileBytes     int64   `json:"file_bytes"`    // the chunk files' bytes, padded
	IndexBytes    int64   `json:"index_bytes"`   // index.pfi's bytes
	SpecHash      string  `json:"spec_sha256"`   // hex
	Seconds       float64 `json:"seconds"`
}

// Pack packs spec's samples into the directory out (created if missing),
// as the comment above describes. progress, when not nil, is called with
// the samples packed so far and their total, from one goroutine at a time,
// done increasing.
//
// out may be empty, missing, or hold a pack (complete or interrupted) that
// Pack wrote: of the same spec it resumes, keeping the chunk files whose
// bytes match; of another it restarts, removing the stale chunk files.
// Anything else in out is refused (ErrNotOurs) before anything is written.
// A bad spec gives an error wrapping ErrInvalid; a source that cannot be
// read, its path and the I/O error.
func Pack(spec PackSpec, out string, progress func(done, total int64)) (PackStats, error) {
	start := time.Now()
	if err := spec.check(); err != nil {
		return PackStats{}, err
	}
	fsys := spec.FS
	if fsys == nil {
		fsys = transfer.OS
	}
	if err := os.MkdirAll(out, 0o777); err != nil {
		return PackStats{}, fmt.Errorf("loader: pack: %w", gds.Classify(err))
	}
	dir, err := scanOut(out)
	if err != nil {
		return PackStats{}, err
	}
	hash := specHash(&spec)
	n, size := len(spec.Samples), spec.ChunkSize
	st := PackStats{Samples: n, Chunks: numChunks(n, size), SpecHash: hex.EncodeToString(hash[:])}
	if st.Resumed, st.StaleRemoved, err = dir.prepare(&spec, hash, fsys); err != nil {
		return st, err
	}

	ix := &Index{Version: FormatVersion, Seed: spec.Seed, ChunkSize: size, Alignment: transfer.Alignment,
		SpecHash: hash, Classes: spec.Classes, Chunks: make([]ChunkEntry, st.Chunks), Samples: make([]SampleEntry, n)}
	pk := &packer{spec: &spec, out: out, fsys: fsys, ix: ix, order: shuffled(n, spec.Seed)}
	var mu sync.Mutex
	var done int64
	workers := spec.Workers
	if workers == 0 {
		workers = PackWorkers
	}
	err = transfer.Run(st.Chunks, workers, func(c int) error {
		kept, err := pk.chunk(c, dir.hasChunk(c))
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if kept {
			st.ChunksKept++
		} else {
			st.ChunksWritten++
		}
		done += int64(ix.Chunks[c].Samples)
		if progress != nil {
			progress(done, int64(n))
		}
		return nil
	})
	if err != nil {
		return st, err
	}
	for c := range ix.Chunks {
		st.DataBytes += ix.Chunks[c].DataLength
		st.FileBytes += ix.Chunks[c].Length
		if err := fsys.Sync(filepath.Join(out, ix.Chunks[c].Name)); err != nil {
			return st, fmt.Errorf("loader: pack: %w", gds.Classify(err))
		}
	}
	if err := fsys.SyncDir(out); err != nil {
		return st, fmt.Errorf("loader: pack: %w", gds.Classify(err))
	}
	b := encodeIndex(ix)
	_, _, err = transfer.WriteFile(filepath.Join(out, IndexName), int64(len(b)), []transfer.Extent{{Data: b}},
		true, fsys, transfer.Options{Chooser: transfer.Fixed("posix")})
	if err != nil {
		return st, fmt.Errorf("loader: pack: writing %s: %w", filepath.Join(out, IndexName), err)
	}
	st.IndexBytes = int64(len(b))
	st.Seconds = time.Since(start).Seconds()
	return st, nil
}

// packer packs the chunks of one Pack call; chunk runs on several
// goroutines, each writing only its own chunk's entries of ix.
type packer struct {
	spec  *PackSpec
	out   string
	fsys  transfer.FS
	ix    *Index
	order []int // order[p] is the source index at position p
}

// sourceEngine reads sources: through the page cache, whatever their
// size. They are read once each, mostly small, at offsets of the chunk
// buffer that are not aligned; and the resident measurement Default's
// chooser makes per transfer would cost a few system calls per file.
const sourceEngine = transfer.Fixed("posix")

// chunk packs chunk c: reads its sources into one aligned buffer (their
// bytes back to back, zeros to the alignment), fills its entries of the
// index, and writes its file, or keeps the file present when its bytes
// are those (present says a file of its name was there).
func (pk *packer) chunk(c int, present bool) (kept bool, err error) {
	size := pk.ix.ChunkSize
	lo, hi := c*size, min((c+1)*size, len(pk.order))
	lengths := make([]int64, hi-lo)
	var dataLen int64
	for k := range lengths {
		src := pk.order[lo+k]
		path := pk.spec.Samples[src].Path
		fi, err := os.Stat(path)
		if err != nil {
			return false, fmt.Errorf("loader: pack: sample %d: %w", src, gds.Classify(err))
		}
		if !fi.Mode().IsRegular() {
			return false, fmt.Errorf("%w: pack: sample %d: %s is not a regular file", ErrInvalid, src, path)
		}
		lengths[k] = fi.Size()
		if dataLen += fi.Size(); dataLen > MaxChunkBytes {
			return false, fmt.Errorf("%w: pack: chunk %d would hold more than %d bytes", ErrInvalid, c, int64(MaxChunkBytes))
		}
	}
	fileLen := alignUp(dataLen, transfer.Alignment)
	buf := gds.AlignedBuf(int(fileLen), gds.DirectAlign)
	var off int64
	for k, n := range lengths {
		src := pk.order[lo+k]
		p := buf[off : off+n]
		if n > 0 {
			path := pk.spec.Samples[src].Path
			if _, _, err := transfer.Read(path, []transfer.Extent{{Data: p}}, transfer.Options{Chooser: sourceEngine, Workers: 1}); err != nil {
				if errors.Is(err, gds.ErrEOF) {
					return false, fmt.Errorf("loader: pack: sample %d: %s is shorter than the %d bytes it had when measured: %w", src, path, n, err)
				}
				return false, fmt.Errorf("loader: pack: sample %d: %w", src, err)
			}
		}
		pk.ix.Samples[lo+k] = SampleEntry{Chunk: c, Offset: off, Length: n, Label: pk.spec.Samples[src].Label,
			CRC: transfer.Checksum(p), Source: src}
		off += n
	}
	name := ChunkName(c)
	pk.ix.Chunks[c] = ChunkEntry{Name: name, Length: fileLen, DataLength: dataLen, Samples: hi - lo, CRC: transfer.Checksum(buf)}
	path := filepath.Join(pk.out, name)
	if present && sameBytes(path, buf) {
		return true, nil
	}
	_, _, err = transfer.WriteFile(path, fileLen, []transfer.Extent{{Data: buf}}, false, pk.fsys, transfer.Options{})
	if err != nil {
		return false, fmt.Errorf("loader: pack: writing %s: %w", path, err)
	}
	return false, nil
}

// sameBytes reports whether the file at path holds exactly want (a chunk
// file an interrupted run left: kept only when it is byte for byte the
// one this run would write; any read error means no).
func sameBytes(path string, want []byte) bool {
	fi, err := os.Stat(path)
	if err != nil || fi.Size() != int64(len(want)) {
		return false
	}
	got := gds.AlignedBuf(len(want), gds.DirectAlign)
	if _, _, err := transfer.Read(path, []transfer.Extent{{Data: got}}, transfer.Options{}); err != nil {
		return false
	}
	return bytes.Equal(got, want)
}
