package loader

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"unicode/utf8"

	"github.com/pyfastensor/pyfastensor/transfer"
)

// SampleSpec is one sample to pack: a file and its label (an index into
// PackSpec.Classes).
type SampleSpec struct {
	Path  string `json:"path"`
	Label int    `json:"label"`
}

// PackSpec is what Pack packs: the samples (their index here is their
// source index), the class names, the chunk size N (samples per chunk;
// the paper measured 64 best) and the seed of the shuffle. Workers and FS
// change how it is written, never what: they are not part of the spec's
// hash.
type PackSpec struct {
	Samples   []SampleSpec `json:"samples"`
	Classes   []string     `json:"classes"`
	ChunkSize int          `json:"chunk_size"`
	Seed      uint64       `json:"seed"`
	// Workers is the number of chunks packed at once; 0 means PackWorkers.
	Workers int `json:"workers,omitempty"`
	// FS is the filesystem the commit steps go through (tests inject
	// faults with transfer.FaultFS); nil means the real one.
	FS transfer.FS `json:"-"`
}

// PackWorkers is the number of chunks packed at once. Each holds one
// chunk's bytes (twice while a resumed chunk is compared); a chunk's
// sources are read one after the other (small files), so a few chunks in
// flight keep a few requests queued at the disk. Not measured yet: it is
// the write path's queue depth halved (transfer.WriteWorkers).
const PackWorkers = transfer.WriteWorkers / 2

// check refuses a spec Pack cannot pack, naming the bad field.
func (s *PackSpec) check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: pack: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	switch {
	case len(s.Samples) == 0:
		return bad("no samples")
	case len(s.Samples) > MaxSamples:
		return bad("%d samples (at most %d)", len(s.Samples), MaxSamples)
	case s.ChunkSize < 1 || s.ChunkSize > MaxChunkSize:
		return bad("chunk size %d (1 to %d samples)", s.ChunkSize, MaxChunkSize)
	case len(s.Classes) == 0:
		return bad("no class names (a dataset without labels has one class)")
	case len(s.Classes) > MaxClasses:
		return bad("%d classes (at most %d)", len(s.Classes), MaxClasses)
	case s.Workers < 0:
		return bad("%d workers", s.Workers)
	}
	seen := make(map[string]int, len(s.Classes))
	for i, c := range s.Classes {
		switch j, dup := seen[c]; {
		case len(c) > MaxClassName || !utf8.ValidString(c):
			return bad("class %d: name of %d bytes is not UTF-8 of at most %d bytes", i, len(c), MaxClassName)
		case dup:
			return bad("class %d: name %q is class %d's too", i, c, j)
		}
		seen[c] = i
	}
	for i, x := range s.Samples {
		switch {
		case x.Path == "":
			return bad("sample %d: no path", i)
		case x.Label < 0 || x.Label >= len(s.Classes):
			return bad("sample %d (%s): label %d of %d classes", i, x.Path, x.Label, len(s.Classes))
		}
	}
	return nil
}

// specHash is the SHA-256 of what decides a pack's contents: the format
// version, chunk size, seed, class names and samples (path and label), each
// length-prefixed. A re-run of Pack with the same hash resumes; another
// restarts.
func specHash(s *PackSpec) [32]byte {
	h := sha256.New()
	var b []byte
	str := func(v string) {
		b = binary.LittleEndian.AppendUint64(b, uint64(len(v)))
		b = append(b, v...)
	}
	b = append(b, "pyfastensor pack spec"...)
	b = binary.LittleEndian.AppendUint32(b, FormatVersion)
	b = binary.LittleEndian.AppendUint64(b, uint64(s.ChunkSize))
	b = binary.LittleEndian.AppendUint64(b, s.Seed)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(s.Classes)))
	for _, c := range s.Classes {
		str(c)
	}
	b = binary.LittleEndian.AppendUint64(b, uint64(len(s.Samples)))
	for _, x := range s.Samples {
		str(x.Path)
		b = binary.LittleEndian.AppendUint64(b, uint64(x.Label))
		if len(b) > 1<<16 {
			h.Write(b)
			b = b[:0]
		}
	}
	h.Write(b)
	var out [32]byte
	h.Sum(out[:0])
	return out
}
