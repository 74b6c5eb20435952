package checkpoint

import (
	"fmt"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// SumPart sums src, bytes [off, off+len(src)) of record index already in
// memory (read back from the device a CUDA load read it to), onto crc, that
// of the record's bytes before off (0 for the first part), in parallel
// pieces; it returns the new sum and checks the record's CRC-32 at its last
// part (ErrCorrupt naming the record). The parts of a record come in
// order.
func (a *Archive) SumPart(index int, off int64, src []byte, crc uint32) (uint32, error) {
	if _, err := a.part(index, off, len(src)); err != nil {
		return 0, err
	}
	pieces := transfer.Split(0, int64(len(src)), transfer.SumChunk)
	sums := transfer.NewPieceCRCs(len(pieces))
	_ = transfer.Run(len(pieces), transfer.CachedReadWorkers(), func(k int) error {
		p := pieces[k]
		sums.Set(k, transfer.Checksum(src[p.Lo:p.Hi]), p.Hi-p.Lo)
		return nil
	})
	return a.partSummed(index, off, len(src), crc, sums.Total())
}

// part checks that bytes [off, off+n) lie in stored record index.
func (a *Archive) part(index int, off int64, n int) (*Entry, error) {
	if index < 0 || index >= len(a.Entries) {
		return nil, fmt.Errorf("%w: record index %d out of range (%d records)", gds.ErrInvalid, index, len(a.Entries))
	}
	e := &a.Entries[index]
	if e.Method != 0 {
		return nil, fmt.Errorf("%w: record %q is compressed (method %d)", gds.ErrUnsupported, e.Name, e.Method)
	}
	if off < 0 || off+int64(n) > e.Size {
		return nil, fmt.Errorf("%w: record %q has %d bytes, part of %d at %d", gds.ErrInvalid, e.Name, e.Size, n, off)
	}
	return e, nil
}

// partSummed joins a part's sum to the record's sum so far and, at the
// record's last part, checks the total.
func (a *Archive) partSummed(index int, off int64, n int, crc, partCRC uint32) (uint32, error) {
	crc = transfer.Combine(crc, partCRC, int64(n))
	if off+int64(n) == a.Entries[index].Size {
		if err := a.checkCRC(index, crc); err != nil {
			return crc, err
		}
	}
	return crc, nil
}
