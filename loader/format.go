// Package loader is the Go core of Brand, the chunked training-data loader
// (DESIGN.md, "Training data (Brand) in one paragraph"; the paper in
// seeds/003, sections 3.1 to 3.3 and 4.1).
//
// A pack (Pack) is a directory: the samples of a dataset, shuffled once
// with a seeded PRNG and cut into chunks of N samples, one file per chunk
// (chunk-<n>.bin, the samples back to back, padded to transfer.Alignment
// so that a chunk is one O_DIRECT read), a plan (pack.plan, written first)
// and an index (index.pfi, written last). OpenPack parses and checks the
// index; VerifyPack re-reads every chunk.
//
// A Server serves an opened pack from an abstract memory of a byte budget
// (memory.go): consecutive chunks form groups, each group maps to one
// abstract chunk of N slots; a request for position i is answered by the
// sample in i's slot of its group's abstract chunk, which is then
// invalidated; an empty slot is refilled with the group's chunk that fills
// the most empty slots (refill.go). Every sample is delivered exactly once
// per epoch, in an order that is a function of (seed, epoch, request
// sequence); State and Restore resume an epoch in a new process.
//
// Bytes move only through transfer (Read, WriteFile). Types are plain Go
// values and JSON-able structs, for a thin C boundary.
package loader

import (
	"fmt"
	"strconv"
	"strings"
)

// The format of a pack, version 1. All integers little-endian.
//
// index.pfi:
//
//	header (indexHeaderSize bytes)
//	  0  magic        "PFTBRAND"
//	  8  version      u32 (FormatVersion)
//	 12  flags        u32 (0: none defined)
//	 16  samples      u64
//	 24  chunks       u64 (ceil(samples / chunk size))
//	 32  classes      u32
//	 36  chunk size   u32 (N, samples per chunk; the last may hold fewer)
//	 40  seed         u64 (of the shuffle)
//	 48  alignment    u32 (chunk files' lengths are multiples of it)
//	 52  reserved     u32 (0)
//	 56  spec hash    32 bytes (SHA-256 of the spec, specHash)
//	class names: u32 length + UTF-8 bytes, each
//	chunk table, each: u16 name length + name, u64 file length,
//	                   u64 data length, u32 samples, u32 CRC-32 of the file
//	sample table (indexSampleSize bytes each, in pack order: sample k of
//	chunk c is position c*N+k): u32 chunk, u64 offset, u64 length,
//	                   u32 label, u32 CRC-32 of the sample, u64 source index
//	u32 CRC-32 of every byte before it
//
// A chunk file holds its samples back to back from offset 0 (its data
// length), then zeros up to its file length, the next multiple of the
// alignment.
const (
	// FormatVersion is the newest index version this build writes and reads.
	FormatVersion = 1

	indexMagic      = "PFTBRAND"
	indexHeaderSize = 88
	indexSampleSize = 36
	indexChunkFixed = 2 + 8 + 8 + 4 + 4 // a chunk entry without its name
	indexTrailer    = 4

	// IndexName and PlanName are the index's and the plan's file names.
	IndexName = "index.pfi"
	PlanName  = "pack.plan"

	// MaxChunkSize bounds N: a chunk of more samples is not a chunk any
	// more (the paper measured 64 best), and the bound keeps per-chunk
	// bitmaps and a damaged index's claims small.
	MaxChunkSize = 1 << 20
	// MaxSamples bounds a pack's samples: positions and source indexes are
	// u32 in memory (index.go stores u64 for sources, u32 for chunks).
	MaxSamples = 1<<32 - 1
	// MaxClasses bounds the class table.
	MaxClasses = 1 << 24
	// MaxClassName bounds a class name's bytes.
	MaxClassName = 4096
	// MaxChunkBytes bounds a chunk file (1 TiB): no sum of offsets and
	// lengths in a valid index can overflow.
	MaxChunkBytes = 1 << 40
	// minAlignment and maxAlignment bound the alignment an index may
	// state: a power of two from a disk sector to a huge page.
	minAlignment = 512
	maxAlignment = 2 << 20
)

// Index is a parsed, checked index: what a pack holds and where.
type Index struct {
	Version   uint32        `json:"version"`
	Flags     uint32        `json:"flags"`
	Seed      uint64        `json:"seed"`
	ChunkSize int           `json:"chunk_size"`
	Alignment int64         `json:"alignment"`
	SpecHash  [32]byte      `json:"spec_hash"`
	Classes   []string      `json:"classes"`
	Chunks    []ChunkEntry  `json:"chunks"`
	Samples   []SampleEntry `json:"samples"`
	// CRC is the index file's own CRC-32 (its trailer): with SpecHash, the
	// identity of a pack that a saved server state names.
	CRC uint32 `json:"crc"`
}

// ChunkEntry is one chunk file.
type ChunkEntry struct {
	Name       string `json:"name"`        // file name in the pack's directory
	Length     int64  `json:"length"`      // file length, padded
	DataLength int64  `json:"data_length"` // bytes of its samples
	Samples    int    `json:"samples"`
	CRC        uint32 `json:"crc"` // CRC-32 of the whole file
}

// SampleEntry is one sample, at its position in the pack.
type SampleEntry struct {
	Chunk  int    `json:"chunk"`
	Offset int64  `json:"offset"` // in the chunk file
	Length int64  `json:"length"`
	Label  int    `json:"label"` // index into Classes
	CRC    uint32 `json:"crc"`
	Source int    `json:"source"` // index of the sample in the PackSpec
}

// ChunkName is the file name of chunk n.
func ChunkName(n int) string { return "chunk-" + strconv.Itoa(n) + ".bin" }

// chunkNumber returns n for a name ChunkName(n) wrote, and false for
// anything else (leading zeros, signs and other spellings included).
func chunkNumber(name string) (int, bool) {
	digits, ok := strings.CutPrefix(name, "chunk-")
	if !ok {
		return 0, false
	}
	digits, ok = strings.CutSuffix(digits, ".bin")
	if !ok || digits == "" || (len(digits) > 1 && digits[0] == '0') {
		return 0, false
	}
	for _, r := range digits {
		if r < '0' || r > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil
}

// alignUp rounds n up to a multiple of a (a power of two).
func alignUp(n, a int64) int64 { return (n + a - 1) &^ (a - 1) }

// chunkSamples is how many samples chunk c of a pack of n samples in
// chunks of size holds: size, but the last chunk's remainder.
func chunkSamples(c, n, size int) int { return min(size, n-c*size) }

// numChunks is ceil(n / size).
func numChunks(n, size int) int { return (n + size - 1) / size }

// Len is the number of samples.
func (ix *Index) Len() int { return len(ix.Samples) }

// ChunkOf returns the chunk and slot of position i.
func (ix *Index) ChunkOf(i int) (chunk, slot int) { return i / ix.ChunkSize, i % ix.ChunkSize }

// String is a one-line summary.
func (ix *Index) String() string {
	return fmt.Sprintf("pack v%d: %d samples in %d chunks of %d, %d classes, seed %d",
		ix.Version, len(ix.Samples), len(ix.Chunks), ix.ChunkSize, len(ix.Classes), ix.Seed)
}
