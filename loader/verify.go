package loader

import (
	"fmt"
	"sync"

	"github.com/pyfastensor/pyfastensor/transfer"
)

// VerifyWorkers is the number of chunks VerifyPack reads at once: each
// holds one chunk file's bytes; the reads themselves are split into
// engine tasks by transfer.Read, so a few chunks keep the disk busy.
const VerifyWorkers = 4

// VerifyPack opens dir's pack (OpenPack's checks) and re-reads every chunk
// file through transfer.Read, checking its CRC-32 and each sample's
// against the index. It returns nil, or the error about the first damaged
// chunk file in chunk order, naming the file and the first damaged sample
// in it (a *CorruptError; Sample is -1 when only the padding is damaged).
// progress, when not nil, is called with the chunk bytes checked so far
// and their total, from one goroutine at a time.
func VerifyPack(dir string, progress func(done, total int64)) error {
	p, err := OpenPack(dir)
	if err != nil {
		return err
	}
	var total int64
	for _, c := range p.Index.Chunks {
		total += c.Length
	}
	var mu sync.Mutex
	var done int64
	var largest int64
	for _, c := range p.Index.Chunks {
		largest = max(largest, c.Length)
	}
	bufs := newBufPool(VerifyWorkers * max(largest, chunkBufStep))
	return transfer.Run(len(p.Index.Chunks), VerifyWorkers, func(c int) error {
		if err := verifyChunk(p, c, bufs); err != nil {
			return err
		}
		if progress != nil {
			mu.Lock()
			done += p.Index.Chunks[c].Length
			progress(done, total)
			mu.Unlock()
		}
		return nil
	})
}

// verifyChunk checks chunk c's file against the index.
func verifyChunk(p *Packed, c int, bufs *bufPool) error {
	buf, free, err := readChunk(p, c, transfer.Options{}, bufs)
	if err != nil {
		return err
	}
	defer free()
	ch := &p.Index.Chunks[c]
	got := transfer.Checksum(buf)
	if got == ch.CRC {
		return nil
	}
	size := p.Index.ChunkSize
	for i := c * size; i < c*size+ch.Samples; i++ {
		if err := checkSample(p, i, buf); err != nil {
			return err
		}
	}
	for off := ch.DataLength; off < ch.Length; off++ {
		if buf[off] != 0 {
			return &CorruptError{Path: p.ChunkPath(c), Chunk: c, Sample: -1, Offset: off,
				Reason: fmt.Sprintf("the padding after the samples is not zero (file CRC-32 %#08x where the index has %#08x)", got, ch.CRC)}
		}
	}
	return &CorruptError{Path: p.ChunkPath(c), Chunk: c, Sample: -1, Offset: -1,
		Reason: fmt.Sprintf("file CRC-32 %#08x where the index has %#08x, though every sample checks (the index's chunk table is damaged?)", got, ch.CRC)}
}
