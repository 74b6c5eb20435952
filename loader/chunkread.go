package loader

import (
	"errors"
	"fmt"
	"os"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// Reading a chunk: the whole file in one transfer.Read (one request per
// engine task, O_DIRECT where the chooser says it pays), into memory
// aligned for it, then the checks its reader asks for. The server and
// VerifyPack read chunks only through here.

// readChunk reads chunk c of p whole into a buffer of its file length from
// bufs (chunkbuf.go: reused, huge-page memory for chunks of several MiB,
// which then reach the device as requests of several MiB where scattered
// pages cut them at about 1 MiB), through o's chooser (nil: transfer's
// default for the directory); the caller calls free once done with buf. A
// missing or short file is a *CorruptError naming it.
func readChunk(p *Packed, c int, o transfer.Options, bufs *bufPool) (buf []byte, free func(), err error) {
	ch := &p.Index.Chunks[c]
	path := p.ChunkPath(c)
	if ch.Length == 0 {
		// An empty chunk (its samples all empty): still a file to find.
		if _, err := os.Stat(path); err != nil {
			return nil, func() {}, &CorruptError{Path: path, Chunk: c, Sample: -1, Offset: -1, Reason: "cannot read the chunk file", Err: gds.Classify(err)}
		}
		return []byte{}, func() {}, nil
	}
	buf, free = bufs.get(int(ch.Length))
	if _, _, err := transfer.Read(path, []transfer.Extent{{Data: buf}}, o); err != nil {
		reason := "cannot read the chunk file"
		if errors.Is(err, gds.ErrEOF) {
			reason = fmt.Sprintf("shorter than the %d bytes the index gives it", ch.Length)
		}
		free()
		return nil, func() {}, &CorruptError{Path: path, Chunk: c, Sample: -1, Offset: -1, Reason: reason, Err: err}
	}
	return buf, free, nil
}

// checkSample checks the bytes of position i in its chunk's buffer
// against the index's CRC-32.
func checkSample(p *Packed, i int, buf []byte) error {
	s := &p.Index.Samples[i]
	if got := transfer.Checksum(buf[s.Offset : s.Offset+s.Length]); got != s.CRC {
		return &CorruptError{Path: p.ChunkPath(s.Chunk), Chunk: s.Chunk, Sample: i, Offset: s.Offset,
			Reason: fmt.Sprintf("%d bytes of sample %d (source %d) have CRC-32 %#08x where the index has %#08x",
				s.Length, i, s.Source, got, s.CRC)}
	}
	return nil
}

// readWhole reads a small file (the index) whole, through the page cache.
func readWhole(path string, size int64) ([]byte, error) {
	data := make([]byte, size)
	if size == 0 {
		return data, nil
	}
	if _, _, err := transfer.Read(path, []transfer.Extent{{Data: data}}, transfer.Options{Chooser: transfer.Fixed("posix")}); err != nil {
		if errors.Is(err, gds.ErrEOF) {
			return nil, corrupt(path, -1, "shorter than the %d bytes it had when measured (truncated while read?)", size)
		}
		return nil, fmt.Errorf("loader: %w", err)
	}
	return data, nil
}
