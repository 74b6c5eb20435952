package checkpoint

import (
	"errors"
	"fmt"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// Raw files: byte extents at offsets a format laid out (a safetensors
// file's header and tensors), written through transfer with the durable
// commit of an archive, and read back in parallel. No zip, no CRC.

// Extent is a run of bytes at a file offset.
type Extent = transfer.Extent

// SaveRaw writes extents into a new file of size bytes at path, committed
// as transfer/commit.go describes. Bytes no extent covers are zero.
func SaveRaw(path string, size int64, extents []Extent, o WriteOptions) (Stats, error) {
	start := time.Now()
	_, st, err := transfer.WriteFile(path, size, extents, !o.NotDurable, o.FS, o.transferOptions())
	if err != nil {
		return Stats{}, fmt.Errorf("checkpoint: save %s: %w", path, err)
	}
	out := Stats{FileBytes: size, DataBytes: st.Bytes, Engines: st.Engines, Seconds: time.Since(start).Seconds()}
	return out, nil
}

// ReadRaw fills extents from the file at path, in parallel. A file shorter
// than an extent's end gives an error wrapping ErrCorrupt.
func ReadRaw(path string, extents []Extent, o ReadOptions) (Stats, error) {
	start := time.Now()
	_, st, err := transfer.Read(path, extents, o.transferOptions())
	if err != nil {
		var ee *transfer.ExtentError
		if errors.As(err, &ee) && errors.Is(err, gds.ErrEOF) {
			return Stats{}, corrupt(transfer.ShownName(path), "", ee.Off, "file ends before the %d bytes expected here (truncated?)",
				len(extents[ee.Ext].Data))
		}
		return Stats{}, err
	}
	return Stats{DataBytes: st.Bytes, Engines: st.Engines, Seconds: time.Since(start).Seconds()}, nil
}

// RawRing reads extents of a file through a ring of slots reused from fill
// to fill (transfer.Ring): a CUDA load of a safetensors file through its
// pinned slots. A file shorter than an extent's end gives an error
// wrapping ErrCorrupt, as ReadRaw does. Next and Close are for one
// goroutine.
type RawRing struct {
	path string
	ring *transfer.Ring
	exts []transfer.RingExtent
}

// StartRawRing starts reading exts of the file at path into slots: fill k
// goes to slots[fillSlots[k]], exts in fill order (transfer.StartRing).
func StartRawRing(path string, slots [][]byte, fillSlots []int, exts []transfer.RingExtent, o ReadOptions) (*RawRing, error) {
	ring, err := transfer.StartRing(path, slots, fillSlots, exts, false, o.transferOptions(), nil)
	if err != nil {
		return nil, err
	}
	return &RawRing{path: path, ring: ring, exts: exts}, nil
}

// Next releases fill release's slot (-1: none) and returns the next fill
// once it has landed, or -1 once every fill has been returned.
func (r *RawRing) Next(release int) (int, error) {
	k, _, _, err := r.ring.Next(release)
	return k, r.wrap(err)
}

// Close stops the read and returns once no read is in flight; it returns
// the read's error, if one failed.
func (r *RawRing) Close() error { return r.wrap(r.ring.Close()) }

func (r *RawRing) wrap(err error) error {
	var ee *transfer.ExtentError
	if errors.As(err, &ee) && errors.Is(err, gds.ErrEOF) {
		return corrupt(transfer.ShownName(r.path), "", ee.Off, "file ends before the %d bytes expected here (truncated?)",
			r.exts[ee.Ext].Len)
	}
	return err
}
