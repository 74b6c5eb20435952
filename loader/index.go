package loader

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"unicode/utf8"

	"github.com/pyfastensor/pyfastensor/transfer"
)

// The index file, on byte slices: encodeIndex lays it out, ParseIndex
// reads and checks it. No I/O here (pack.go and open.go move the bytes).

var le = binary.LittleEndian

// encodeIndex returns the bytes of ix's index file (format.go), its
// trailer the CRC-32 of everything before it. ix must be valid (Pack
// builds it); ix.CRC is ignored.
func encodeIndex(ix *Index) []byte {
	size := indexHeaderSize + len(ix.Samples)*indexSampleSize + indexTrailer
	for _, c := range ix.Classes {
		size += 4 + len(c)
	}
	for _, c := range ix.Chunks {
		size += indexChunkFixed + len(c.Name)
	}
	b := make([]byte, 0, size)
	b = append(b, indexMagic...)
	b = le.AppendUint32(b, ix.Version)
	b = le.AppendUint32(b, ix.Flags)
	b = le.AppendUint64(b, uint64(len(ix.Samples)))
	b = le.AppendUint64(b, uint64(len(ix.Chunks)))
	b = le.AppendUint32(b, uint32(len(ix.Classes)))
	b = le.AppendUint32(b, uint32(ix.ChunkSize))
	b = le.AppendUint64(b, ix.Seed)
	b = le.AppendUint32(b, uint32(ix.Alignment))
	b = le.AppendUint32(b, 0)
	b = append(b, ix.SpecHash[:]...)
	for _, c := range ix.Classes {
		b = le.AppendUint32(b, uint32(len(c)))
		b = append(b, c...)
	}
	for _, c := range ix.Chunks {
		b = le.AppendUint16(b, uint16(len(c.Name)))
		b = append(b, c.Name...)
		b = le.AppendUint64(b, uint64(c.Length))
		b = le.AppendUint64(b, uint64(c.DataLength))
		b = le.AppendUint32(b, uint32(c.Samples))
		b = le.AppendUint32(b, c.CRC)
	}
	for _, s := range ix.Samples {
		b = le.AppendUint32(b, uint32(s.Chunk))
		b = le.AppendUint64(b, uint64(s.Offset))
		b = le.AppendUint64(b, uint64(s.Length))
		b = le.AppendUint32(b, uint32(s.Label))
		b = le.AppendUint32(b, s.CRC)
		b = le.AppendUint64(b, uint64(s.Source))
	}
	return le.AppendUint32(b, transfer.Checksum(b))
}

// ParseIndex parses and checks the index file at path, whose bytes are
// data. In order: the magic; the version (newer than FormatVersion gives a
// *VersionError, before anything else is trusted, since a newer version
// may place its checksum elsewhere); the CRC-32 trailer; then every field:
// counts bounded and consistent with each other and with the file's
// length (before anything is allocated from them), class names UTF-8 and
// distinct, each chunk named ChunkName(n) with the sample count its place
// gives it and a file length that is its data length padded to the
// alignment, each sample in its chunk, back to back from offset 0 to the
// chunk's data length, its label a class, and the source indexes a
// permutation. Any failure is a *CorruptError naming path, the offset and
// what is wrong.
func ParseIndex(path string, data []byte) (*Index, error) {
	if len(data) < 12 || string(data[:8]) != indexMagic {
		return nil, corrupt(path, 0, "not a pack index (no %q magic in its %d bytes)", indexMagic, len(data))
	}
	ix := &Index{Version: le.Uint32(data[8:])}
	switch {
	case ix.Version > FormatVersion:
		return nil, &VersionError{Path: path, Found: ix.Version, Supported: FormatVersion}
	case ix.Version == 0:
		return nil, corrupt(path, 8, "format version 0")
	case len(data) < indexHeaderSize+indexTrailer:
		return nil, corrupt(path, int64(len(data)), "%d bytes: shorter than the %d-byte header and trailer (truncated?)",
			len(data), indexHeaderSize+indexTrailer)
	}
	body := data[:len(data)-indexTrailer]
	if want, got := le.Uint32(data[len(body):]), transfer.Checksum(body); want != got {
		return nil, corrupt(path, int64(len(body)), "index CRC-32 %#08x where its trailer says %#08x (damaged or truncated)", got, want)
	}
	ix.CRC = le.Uint32(data[len(body):])
	p := &indexParser{path: path, b: body}
	if err := p.parseHeader(ix); err != nil {
		return nil, err
	}
	if err := p.parseClasses(ix); err != nil {
		return nil, err
	}
	if err := p.parseChunks(ix); err != nil {
		return nil, err
	}
	if err := p.parseSamples(ix); err != nil {
		return nil, err
	}
	return ix, nil // parseChunks saw that the sample table ends the body
}

// indexParser reads an index's body (the bytes before the trailer).
type indexParser struct {
	path string
	b    []byte
	off  int // next byte to read
	// counts from the header, checked against the body's length
	nSamples, nChunks, nClasses int
}

func (p *indexParser) left() int { return len(p.b) - p.off }

func (p *indexParser) fail(at int, format string, args ...any) error {
	return corrupt(p.path, int64(at), format, args...)
}

func (p *indexParser) u16() uint16 { v := le.Uint16(p.b[p.off:]); p.off += 2; return v }
func (p *indexParser) u32() uint32 { v := le.Uint32(p.b[p.off:]); p.off += 4; return v }
func (p *indexParser) u64() uint64 { v := le.Uint64(p.b[p.off:]); p.off += 8; return v }

func (p *indexParser) parseHeader(ix *Index) error {
	p.off = 12
	ix.Flags = p.u32()
	samples, chunks := p.u64(), p.u64()
	classes, size := p.u32(), p.u32()
	ix.Seed = p.u64()
	align, reserved := p.u32(), p.u32()
	copy(ix.SpecHash[:], p.b[p.off:p.off+32])
	p.off += 32
	switch {
	case ix.Flags != 0:
		return p.fail(12, "unknown flags %#x (version %d defines none)", ix.Flags, ix.Version)
	case samples == 0 || samples > MaxSamples:
		return p.fail(16, "%d samples (a pack holds 1 to %d)", samples, uint64(MaxSamples))
	case size == 0 || size > MaxChunkSize:
		return p.fail(36, "chunk size %d (1 to %d)", size, MaxChunkSize)
	case chunks != (samples+uint64(size)-1)/uint64(size):
		return p.fail(24, "%d chunks for %d samples in chunks of %d (want %d)", chunks, samples, size, (samples+uint64(size)-1)/uint64(size))
	case classes == 0 || classes > MaxClasses:
		return p.fail(32, "%d classes (1 to %d)", classes, MaxClasses)
	case align < minAlignment || align > maxAlignment || bits.OnesCount32(align) != 1:
		return p.fail(48, "alignment %d (a power of two from %d to %d)", align, minAlignment, maxAlignment)
	case reserved != 0:
		return p.fail(52, "reserved field %#x is not zero", reserved)
	}
	// Every sample, chunk and class takes a least number of bytes: counts
	// the body cannot hold are refused before anything is allocated.
	need := samples*indexSampleSize + chunks*indexChunkFixed + uint64(classes)*4
	if need > uint64(p.left()) {
		return p.fail(16, "%d samples, %d chunks and %d classes need at least %d bytes; the index has %d after its header",
			samples, chunks, classes, need, p.left())
	}
	p.nSamples, p.nChunks, p.nClasses = int(samples), int(chunks), int(classes)
	ix.ChunkSize, ix.Alignment = int(size), int64(align)
	return nil
}

func (p *indexParser) parseClasses(ix *Index) error {
	ix.Classes = make([]string, p.nClasses)
	seen := make(map[string]int, p.nClasses)
	for i := range ix.Classes {
		at := p.off
		if p.left() < 4 {
			return p.fail(at, "class %d: the index ends", i)
		}
		n := int(p.u32())
		if n > MaxClassName || n > p.left() {
			return p.fail(at, "class %d: name of %d bytes (at most %d, and %d left)", i, n, MaxClassName, p.left())
		}
		name := p.b[p.off : p.off+n]
		p.off += n
		if !utf8.Valid(name) {
			return p.fail(at, "class %d: name is not UTF-8", i)
		}
		if j, dup := seen[string(name)]; dup {
			return p.fail(at, "class %d: name %q is class %d's too", i, name, j)
		}
		ix.Classes[i] = string(name)
		seen[ix.Classes[i]] = i
	}
	return nil
}

func (p *indexParser) parseChunks(ix *Index) error {
	ix.Chunks = make([]ChunkEntry, p.nChunks)
	for i := range ix.Chunks {
		at := p.off
		if p.left() < 2 {
			return p.fail(at, "chunk %d: the index ends", i)
		}
		n := int(p.u16())
		if p.left() < n+indexChunkFixed-2 {
			return p.fail(at, "chunk %d: the index ends", i)
		}
		name := p.b[p.off : p.off+n]
		p.off += n
		c := ChunkEntry{Name: ChunkName(i)}
		if !bytes.Equal(name, []byte(c.Name)) {
			return p.fail(at, "chunk %d is named %q, not %q", i, name, c.Name)
		}
		length, dataLen, samples := p.u64(), p.u64(), p.u32()
		c.CRC = p.u32()
		want := chunkSamples(i, p.nSamples, ix.ChunkSize)
		switch {
		case dataLen > MaxChunkBytes:
			return p.fail(at, "chunk %d: data length %d (at most %d)", i, dataLen, uint64(MaxChunkBytes))
		case length != uint64(alignUp(int64(dataLen), ix.Alignment)):
			return p.fail(at, "chunk %d: file length %d is not its data length %d padded to %d", i, length, dataLen, ix.Alignment)
		case int(samples) != want:
			return p.fail(at, "chunk %d: %d samples where its place in the pack gives %d", i, samples, want)
		}
		c.Length, c.DataLength, c.Samples = int64(length), int64(dataLen), want
		ix.Chunks[i] = c
	}
	if p.left() != p.nSamples*indexSampleSize {
		return p.fail(p.off, "the sample table is %d bytes, not %d for %d samples", p.left(), p.nSamples*indexSampleSize, p.nSamples)
	}
	return nil
}

func (p *indexParser) parseSamples(ix *Index) error {
	ix.Samples = make([]SampleEntry, p.nSamples)
	seen := make([]uint64, (p.nSamples+63)/64) // sources met, a bitmap
	var end int64                              // where the previous sample of the chunk ended
	for i := range ix.Samples {
		at := p.off
		chunk, off, n := p.u32(), p.u64(), p.u64()
		label, crc, src := p.u32(), p.u32(), p.u64()
		c, k := i/ix.ChunkSize, i%ix.ChunkSize
		if k == 0 {
			end = 0
		}
		dataLen := ix.Chunks[c].DataLength
		switch {
		case int(chunk) != c:
			return p.fail(at, "sample %d: chunk %d where its position gives chunk %d", i, chunk, c)
		case off != uint64(end):
			return p.fail(at, "sample %d: offset %d in %s, where the previous sample ends at %d", i, off, ix.Chunks[c].Name, end)
		case n > uint64(dataLen-end):
			return p.fail(at, "sample %d: %d bytes at %d run past the %d bytes of data of %s", i, n, off, dataLen, ix.Chunks[c].Name)
		case label >= uint32(len(ix.Classes)):
			return p.fail(at, "sample %d: label %d of %d classes", i, label, len(ix.Classes))
		case src >= uint64(p.nSamples) || seen[src/64]&(1<<(src%64)) != 0:
			return p.fail(at, "sample %d: source index %d is out of range or repeated", i, src)
		}
		seen[src/64] |= 1 << (src % 64)
		end += int64(n)
		if k == ix.Chunks[c].Samples-1 && end != dataLen {
			return p.fail(at, "sample %d, the last of %s, ends at %d of its %d bytes of data", i, ix.Chunks[c].Name, end, dataLen)
		}
		ix.Samples[i] = SampleEntry{Chunk: c, Offset: int64(off), Length: int64(n), Label: int(label), CRC: crc, Source: int(src)}
	}
	return nil
}
