package transfer

import (
	"fmt"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Whole files of extents at offsets the caller chose (a safetensors file's
// tensors, say): one Create, Write, Commit; or one Read.

// WriteFile writes extents into a new file of size bytes that replaces
// path, committed as commit.go describes (fsyncs with durable). Bytes no
// extent covers are zero. fsys nil means the real filesystem.
func WriteFile(path string, size int64, exts []Extent, durable bool, fsys FS, o Options) ([]Result, Stats, error) {
	for _, e := range exts {
		if e.Off < 0 || e.Off+e.size() > size {
			return nil, Stats{}, fmt.Errorf("%w: extent of %d bytes at %d outside a file of %d", gds.ErrInvalid, e.size(), e.Off, size)
		}
	}
	w, err := Create(path, size, durable, fsys, o)
	if err != nil {
		return nil, Stats{}, err
	}
	res, err := w.Write(exts)
	if err != nil {
		w.Abort()
		return nil, Stats{}, err
	}
	st, err := w.Commit()
	return res, st, err
}
