package checkpoint

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Safetensors files over caller memory: a save lays the file out
// (safetensors.go) and writes it as a raw file (rawfile.go); an open
// parses the header and pins the file, whose tensors the caller then reads
// with ReadRaw from Source.

// SaveSafetensors writes tensors (each with its Data) and metadata as a
// safetensors file at path, laid out by LayoutSafetensors, through a
// temporary file committed as transfer/commit.go describes. The tensors'
// Data is only read during the call. Invalid tensors give an error
// wrapping gds.ErrInvalid, and nothing is written.
func SaveSafetensors(path string, tensors []STensor, metadata []MetaEntry, o WriteOptions) (Stats, error) {
	header, offsets, size, err := LayoutSafetensors(tensors, metadata, SafetensorsFileAlign(tensors))
	if err != nil {
		return Stats{}, err
	}
	exts := make([]Extent, 0, 1+len(tensors))
	exts = append(exts, Extent{Off: 0, Data: header})
	for i := range tensors {
		t := &tensors[i]
		if int64(len(t.Data)) != t.Size {
			return Stats{}, fmt.Errorf("%w: safetensors: tensor %q: %d bytes of data for a size of %d",
				gds.ErrInvalid, t.Name, len(t.Data), t.Size)
		}
		if t.Size > 0 {
			exts = append(exts, Extent{Off: offsets[i], Data: t.Data})
		}
	}
	return SaveRaw(path, size, exts, o)
}

// SafetensorsFile is an open safetensors file: its validated header (with
// the tensors' absolute offsets) and the file, held open until Close so
// that reads go to the file that was parsed even after a save has replaced
// it at Path (every save of ours replaces a file by a rename).
type SafetensorsFile struct {
	Path string `json:"path"`
	Size int64  `json:"file_size"`
	SafetensorsHeader
	// Fd is the descriptor of the file parsed, open until Close: the
	// caller reopens the same inode through /proc/self/fd/Fd (Source).
	Fd int `json:"fd"`

	mu  sync.Mutex
	pin *os.File
}

// OpenSafetensors reads and validates the header of the safetensors file
// at path (ParseSafetensorsHeader) and keeps the file open. A file that
// fails a check gives an error wrapping ErrCorrupt.
func OpenSafetensors(path string) (*SafetensorsFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, gds.Classify(err)
	}
	sf, err := openSafetensors(f, path)
	if err != nil {
		f.Close()
		return nil, err
	}
	return sf, nil
}

// openSafetensors parses the header of f, opened from path.
func openSafetensors(f *os.File, path string) (*SafetensorsFile, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, gds.Classify(err)
	}
	size := st.Size()
	data := make([]byte, min(size, 8))
	if err := readHeaderBytes(f, path, data); err != nil {
		return nil, err
	}
	// A length that does not fit the file is the parser's to refuse;
	// else read the whole header for it.
	if len(data) == 8 {
		if n := binary.LittleEndian.Uint64(data); n <= safetensorsMaxHeader && int64(n) <= size-8 {
			data = make([]byte, 8+n)
			if err := readHeaderBytes(f, path, data); err != nil {
				return nil, err
			}
		}
	}
	h, err := ParseSafetensorsHeader(path, data, size)
	if err != nil {
		return nil, err
	}
	return &SafetensorsFile{Path: path, Size: size, SafetensorsHeader: *h, Fd: int(f.Fd()), pin: f}, nil
}

// readHeaderBytes fills p from the start of f: a file that ends first (cut
// since it was measured) is corrupt.
func readHeaderBytes(f *os.File, path string, p []byte) error {
	n, err := f.ReadAt(p, 0)
	switch {
	case n == len(p):
		return nil
	case err == io.EOF:
		return corrupt(path, "", int64(n), "safetensors: file ends before the %d bytes of its header (truncated?)", len(p))
	}
	return gds.Classify(err)
}

// Source returns the name that opens the file parsed, for ReadRaw:
// /proc/self/fd/Fd, or Path without /proc. After Close it is an error
// wrapping gds.ErrClosed.
func (sf *SafetensorsFile) Source() (string, error) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if sf.pin == nil {
		return "", fmt.Errorf("%w: safetensors file %s", gds.ErrClosed, sf.Path)
	}
	return pinnedName(sf.pin, sf.Path), nil
}

// Close releases the file (idempotent).
func (sf *SafetensorsFile) Close() error {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if sf.pin == nil {
		return nil
	}
	err := sf.pin.Close()
	sf.pin, sf.Fd = nil, -1
	return err
}
