package checkpoint

import (
	"errors"
	"fmt"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// ReadPart reads bytes [off, off+len(dst)) of record index into dst, for a
// reader that moves a record through a buffer smaller than it (a CUDA load
// through its pinned ring). It returns the part's own CRC-32, summed as it
// lands (0 with o.NoVerify), and checks nothing: the parts of a record may
// be read at once, in any order, and joined in order with JoinPart, which
// checks the record at its last part.
func (a *Archive) ReadPart(index int, off int64, dst []byte, o ReadOptions) (uint32, error) {
	o.NoVerify = o.NoVerify || a.NoCRC
	e, err := a.part(index, off, len(dst))
	if err != nil {
		return 0, err
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	src, err := a.source()
	if err != nil {
		return 0, err
	}
	res, _, err := transfer.Read(src, []transfer.Extent{{Off: e.DataOff + off, Data: dst, Sum: !o.NoVerify}}, o.transferOptions())
	if err != nil {
		var ee *transfer.ExtentError
		if errors.As(err, &ee) && errors.Is(err, gds.ErrEOF) {
			return 0, corrupt(a.Path, e.Name, ee.Off, "file ends inside the record's data (%v)", ee.Err)
		}
		return 0, fmt.Errorf("checkpoint: read %s record %q at %d: %w", a.Path, e.Name, off, err)
	}
	if o.NoVerify {
		return 0, nil
	}
	return res[0].CRC, nil
}

// JoinPart joins the CRC-32 of part [off, off+n) of record index (from
// ReadPart) to crc, that of the record's bytes before off (0 for the first
// part), and returns the sum up to off+n. At the record's last part the
// total is checked against the central directory's: a mismatch is
// ErrCorrupt naming the record.
func (a *Archive) JoinPart(index int, off int64, n int, crc, partCRC uint32) (uint32, error) {
	if _, err := a.part(index, off, n); err != nil {
		return 0, err
	}
	if a.NoCRC {
		return 0, nil
	}
	return a.partSummed(index, off, n, crc, partCRC)
}

// SumPart is ReadPart and JoinPart for a part already in memory (read back
// from where it was read to, a device): it sums src, bytes [off, off+len(src)) of
// record index, onto crc, in parallel pieces, and checks the record's
// CRC-32 at its last part.
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
