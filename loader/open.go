package loader

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Packed is an opened pack: its directory and its checked index.
type Packed struct {
	Dir   string `json:"dir"`
	Index *Index `json:"index"`
}

// indexMax bounds the index file OpenPack reads: MaxSamples samples' worth
// would be 150 GiB; 16 GiB is 400 million samples.
const indexMax = 16 << 30

// OpenPack reads and checks dir's index (ParseIndex) and that every chunk
// file is present with the length the index gives it. A missing index or
// chunk file, or one of another length, is a *CorruptError naming it (a
// pack whose Pack was interrupted has no index); a newer format version a
// *VersionError naming the index and both versions.
func OpenPack(dir string) (*Packed, error) {
	path := filepath.Join(dir, IndexName)
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		e := corrupt(path, -1, "no index: not a pack, or one whose packing did not finish (run the pack again)")
		e.Err = err
		return nil, e
	case err != nil:
		return nil, fmt.Errorf("loader: %w", gds.Classify(err))
	case fi.Size() > indexMax:
		return nil, corrupt(path, -1, "an index of %d bytes (at most %d)", fi.Size(), int64(indexMax))
	}
	data, err := readWhole(path, fi.Size())
	if err != nil {
		return nil, err
	}
	ix, err := ParseIndex(path, data)
	if err != nil {
		return nil, err
	}
	for c := range ix.Chunks {
		ch := &ix.Chunks[c]
		cp := filepath.Join(dir, ch.Name)
		fi, err := os.Stat(cp)
		if err != nil {
			e := &CorruptError{Path: cp, Chunk: c, Sample: -1, Offset: -1, Reason: "chunk file missing or unreadable", Err: gds.Classify(err)}
			return nil, e
		}
		if fi.Size() != ch.Length {
			return nil, &CorruptError{Path: cp, Chunk: c, Sample: -1, Offset: -1,
				Reason: fmt.Sprintf("%d bytes where the index says %d (truncated, or another pack's)", fi.Size(), ch.Length)}
		}
	}
	return &Packed{Dir: dir, Index: ix}, nil
}

// ChunkPath is the path of chunk c's file.
func (p *Packed) ChunkPath(c int) string { return filepath.Join(p.Dir, p.Index.Chunks[c].Name) }
