package checkpoint

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Raw files: byte extents at offsets the caller chose (a safetensors file,
// say), written with the same engines, parallel pieces and durable commit
// as an archive, and read back in parallel. No zip, no CRC.

// Extent is a run of bytes at a file offset.
type Extent struct {
	Off  int64
	Data []byte // read (SaveRaw) or filled (ReadRaw) during the call only
}

// SaveRaw writes extents into a new file of size bytes at path, committed
// as commit.go describes. Bytes no extent covers are zero.
func SaveRaw(path string, size int64, extents []Extent, o WriteOptions) (st Stats, err error) {
	start := time.Now()
	for _, e := range extents {
		if e.Off < 0 || e.Off+int64(len(e.Data)) > size {
			return st, fmt.Errorf("%w: extent of %d bytes at %d outside a file of %d", gds.ErrInvalid, len(e.Data), e.Off, size)
		}
	}
	w, err := saveTemp(path, size, o, func(w *writer) error {
		if err := w.extents(extents); err != nil || o.NotDurable {
			return err
		}
		f, err := w.file("posix")
		if err != nil {
			return err
		}
		return f.Sync()
	})
	if err != nil {
		return st, err
	}
	st = Stats{FileBytes: size, Engines: w.engines, Seconds: time.Since(start).Seconds()}
	for _, e := range extents {
		st.DataBytes += int64(len(e.Data))
	}
	return st, nil
}

// extents writes each extent through its chosen engine, in parallel pieces,
// one engine after the other and posix last. Extents packed without
// alignment share blocks, and two engines must not write one block at
// once: direct patches an edge block by reading it, changing its part and
// writing it back, under a lock only its own writers take, so a page-cache
// write landing in between would be overwritten on the disk and dropped
// from the cache. Within one engine, writers sharing a block are
// serialized by that engine. Page-cache writes after the others find
// their bytes on the disk.
func (w *writer) extents(extents []Extent) error {
	byEngine := map[string][]piece{}
	var order []string
	for i, e := range extents {
		eng := w.o.Chooser.Engine(OpWrite, int64(len(e.Data)))
		if _, seen := byEngine[eng]; !seen {
			order = append(order, eng)
		}
		byEngine[eng] = append(byEngine[eng], splitPieces(i, int64(len(e.Data)), pieceSize(w.o.Engine))...)
	}
	slices.SortStableFunc(order, func(a, b string) int { return cmp.Compare(b2i(a == "posix"), b2i(b == "posix")) })
	for _, eng := range order {
		tasks := byEngine[eng]
		err := runTasks(len(tasks), cmp.Or(w.o.Workers, DefaultWorkers), func(t int) error {
			pc := tasks[t]
			f, err := w.file(eng)
			if err != nil {
				return err
			}
			p := extents[pc.rec].Data[pc.lo:pc.hi]
			if _, err := f.WriteAt(p, extents[pc.rec].Off+pc.lo); err != nil {
				return err
			}
			w.count(f.Engine(), int64(len(p)))
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ReadRaw fills extents from the file at path, in parallel. A file shorter
// than an extent's end gives an error wrapping ErrCorrupt.
func ReadRaw(path string, extents []Extent, o ReadOptions) (st Stats, err error) {
	start := time.Now()
	if o.Chooser == nil {
		dir, derr := dirOf(path)
		if derr != nil {
			return st, derr
		}
		o.Chooser = DefaultChooser(dir)
	}
	var tasks []piece
	offs, sizes := make([]int64, len(extents)), make([]int64, len(extents))
	for i, e := range extents {
		offs[i], sizes[i] = e.Off, int64(len(e.Data))
		tasks = append(tasks, splitPieces(i, int64(len(e.Data)), pieceSize(o.Engine))...)
		st.DataBytes += int64(len(e.Data))
	}
	engines := readEngines(path, o.Chooser, offs, sizes)
	rd := newEngineFiles(path, os.O_RDONLY, o.Engine, o.Progress)
	defer func() {
		if cerr := rd.close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	err = runTasks(len(tasks), cmp.Or(o.Workers, readWorkers(engines)), func(t int) error {
		pc := tasks[t]
		f, err := rd.file(engines[pc.rec])
		if err != nil {
			return err
		}
		p := extents[pc.rec].Data[pc.lo:pc.hi]
		off := extents[pc.rec].Off + pc.lo
		if _, err := f.ReadAt(p, off); err != nil {
			if errors.Is(err, gds.ErrEOF) {
				return corrupt(shownName(path), "", off, "file ends before the %d bytes expected here (truncated?)", len(p))
			}
			return err
		}
		rd.count(f.Engine(), int64(len(p)))
		return nil
	})
	st.Engines, st.Seconds = rd.engines, time.Since(start).Seconds()
	return st, err
}
