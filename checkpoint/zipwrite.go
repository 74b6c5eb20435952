package checkpoint

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
)

// WriteOptions tune Save. The zero value is a durable save with the
// default chooser.
type WriteOptions struct {
	// NotDurable skips the fsyncs of the commit (see commit.go).
	NotDurable bool
	// Chooser picks each large record's engine; nil means
	// DefaultChooser(directory of the target).
	Chooser Chooser
	// Engine holds the engines' options.
	Engine gds.Options
	// Workers is the number of transfers in flight; 0 means DefaultWorkers.
	Workers int
	// Progress, when not nil, is called with each count of data bytes
	// written, as they are written, from several goroutines.
	Progress func(n int64)
}

// Stats describe a finished save or load.
type Stats struct {
	FileBytes int64            `json:"file_bytes"`
	DataBytes int64            `json:"data_bytes"`
	Engines   map[string]int64 `json:"engines"` // data bytes per engine
	Seconds   float64          `json:"seconds"`
}

// extentMin is the smallest record written straight from its memory by its
// own engine. Smaller records are copied into the runs of bytes between
// extents (with the headers around them) and written by posix: one write
// for many small records.
const extentMin = 1 << 20

// runMax bounds a run of such bytes: the memory one task composes.
const runMax = 8 << 20

// Save writes recs, in order, as a zip archive at path, through a
// temporary file committed as commit.go describes. The records' Data is
// only read during the call.
//
// On error nothing new is left at path (the previous file, if any, is
// untouched) and the temporary file is removed.
func Save(path string, recs []Record, o WriteOptions) (st Stats, err error) {
	start := time.Now()
	if err := checkNames(recs); err != nil {
		return st, err
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	l := plan(recs)
	w, err := saveTemp(path, l.total, o, func(w *writer) error {
		w.l = l
		return w.write()
	})
	if err != nil {
		return st, err
	}
	st = Stats{FileBytes: l.total, Engines: w.engines, Seconds: time.Since(start).Seconds()}
	for _, r := range recs {
		st.DataBytes += int64(len(r.Data))
	}
	return st, nil
}

// checkNames refuses names a zip cannot hold or holds twice.
func checkNames(recs []Record) error {
	seen := make(map[string]bool, len(recs))
	for _, r := range recs {
		if r.Name == "" || len(r.Name) > max16 {
			return fmt.Errorf("%w: record name %q: must have 1 to 65535 bytes", gds.ErrInvalid, r.Name)
		}
		if seen[r.Name] {
			return fmt.Errorf("%w: record name %q appears twice", gds.ErrInvalid, r.Name)
		}
		if r.Align < 0 || r.Align&(r.Align-1) != 0 || r.Align > 1<<15 {
			return fmt.Errorf("%w: record %q: alignment %d is not a power of two up to 32768", gds.ErrInvalid, r.Name, r.Align)
		}
		seen[r.Name] = true
	}
	return nil
}

// writer is one save in progress.
type writer struct {
	l            layout
	o            WriteOptions
	tmp          string
	*engineFiles // the temporary file, once per engine
}

// write moves everything: first the extents (large records, straight from
// their memory, each piece checksummed as it is written) and the checksums
// of the small records, then the runs of headers, small records and
// descriptors between extents, and last the central directory.
func (w *writer) write() error {
	recs := w.l.recs
	var tasks []piece
	crcs := make([]*pieceCRCs, len(recs))
	engines := make([]string, len(recs))
	started := make([]atomic.Int64, len(recs))
	left := make([]atomic.Int64, len(recs))
	for i := range recs {
		size := recs[i].size()
		if size == 0 {
			continue
		}
		ps := splitPieces(i, size, pieceSize(w.o.Engine))
		crcs[i] = newPieceCRCs(len(ps))
		left[i].Store(int64(len(ps)))
		if size >= extentMin {
			engines[i] = w.o.Chooser.Engine(OpWrite, size)
		}
		tasks = append(tasks, ps...)
	}
	err := runTasks(len(tasks), w.o.Workers, func(t int) error {
		pc := tasks[t]
		r := &recs[pc.rec]
		p := r.Data[pc.lo:pc.hi]
		if engines[pc.rec] == "" { // small: checksum only, written with the runs
			crcs[pc.rec].set(pc.index, crcOf(p), int64(len(p)))
			return nil
		}
		started[pc.rec].CompareAndSwap(0, time.Now().UnixNano())
		f, err := w.file(engines[pc.rec])
		if err != nil {
			return fmt.Errorf("record %q: %w", r.Name, err)
		}
		crc, _, err := moveSummed(f, true, p, r.dataOff+pc.lo, true)
		if err != nil {
			return fmt.Errorf("record %q: %w", r.Name, err)
		}
		crcs[pc.rec].set(pc.index, crc, int64(len(p)))
		w.count(f.Engine(), int64(len(p)))
		if left[pc.rec].Add(-1) == 0 {
			d := time.Duration(time.Now().UnixNano() - started[pc.rec].Load())
			w.o.Chooser.Observe(OpWrite, r.size(), engines[pc.rec], d)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := range recs {
		if crcs[i] != nil {
			recs[i].crc = crcs[i].total()
		}
	}
	runs := w.runs(engines)
	f, err := w.file("posix")
	if err != nil {
		return err
	}
	err = runTasks(len(runs), w.o.Workers, func(i int) error {
		buf, data := runs[i].compose(recs)
		if int64(len(buf)) != runs[i].n { // the layout and the encoders disagree: a bug
			return fmt.Errorf("%w: run at %d composed %d bytes, planned %d", gds.ErrInternal, runs[i].off, len(buf), runs[i].n)
		}
		if _, err := f.WriteAt(buf, runs[i].off); err != nil {
			return err
		}
		if data > 0 {
			w.count("posix", data)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(w.central(), w.l.cdOff); err != nil {
		return fmt.Errorf("central directory: %w", err)
	}
	if !w.o.NotDurable {
		return f.Sync()
	}
	return nil
}

// span is a part of a run: a record's header, its data, or its descriptor.
type span struct {
	rec  int
	kind byte // 'h' header, 'd' data, 'x' descriptor
}

// run is a contiguous range of the file written as one buffer.
type run struct {
	off, n int64
	spans  []span
}

// runs groups everything before the central directory that is not an
// extent into runs of at most about runMax bytes.
func (w *writer) runs(engines []string) []run {
	var out []run
	var cur *run
	add := func(off, n int64, s span) {
		if n == 0 {
			return
		}
		if cur == nil || cur.off+cur.n != off || cur.n+n > runMax {
			out = append(out, run{off: off})
			cur = &out[len(out)-1]
		}
		cur.n += n
		cur.spans = append(cur.spans, s)
	}
	for i, r := range w.l.recs {
		add(r.hdrOff, r.dataOff-r.hdrOff, span{i, 'h'})
		if engines[i] == "" {
			add(r.dataOff, r.size(), span{i, 'd'})
		}
		add(r.descOff, r.end-r.descOff, span{i, 'x'})
	}
	return out
}

// compose builds a run's bytes; it returns them and how many are record
// data.
func (r run) compose(recs []placed) ([]byte, int64) {
	buf := make([]byte, 0, r.n)
	var data int64
	for _, s := range r.spans {
		p := &recs[s.rec]
		switch s.kind {
		case 'h':
			buf = append(buf, localHeader(p.Name, p.hdrOff, p.size(), p.pad)...)
		case 'd':
			buf = append(buf, p.Data...)
			data += p.size()
		case 'x':
			buf = append(buf, descriptor(p.hdrOff, p.size(), p.crc)...)
		}
	}
	return buf, data
}

// central encodes the central directory, the end records and the comment
// carrying their CRC-32.
func (w *writer) central() []byte {
	b := make([]byte, 0, w.l.total-w.l.cdOff)
	for _, p := range w.l.recs {
		b = centralEntry(b, p.Name, p.hdrOff, p.size(), p.crc)
	}
	b = append(b, endRecords(len(w.l.recs), w.l.cdOff, w.l.cdSize, cdCommentLen)...)
	return append(b, fmt.Sprintf("%s%08x", cdCommentPrefix, crcOf(b))...)
}

// le is shorthand for the zip's byte order.
var le = binary.LittleEndian

// saveTemp is the save protocol shared by archives and raw files: resolve
// the target, clean stale temporaries, create a temporary file of size
// bytes beside it, let fill write it (fill syncs it unless o.NotDurable),
// close the engine files and commit (commit.go). On error the temporary
// file is removed and nothing new is left at path.
func saveTemp(path string, size int64, o WriteOptions, fill func(*writer) error) (*writer, error) {
	abs, err := resolveTarget(path)
	if err != nil {
		return nil, err
	}
	if o.Chooser == nil {
		o.Chooser = DefaultChooser(filepath.Dir(abs))
	}
	CleanStale(abs)
	tmp, err := createTemp(abs, size)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: save %s: %w", path, err)
	}
	w := &writer{o: o, tmp: tmp, engineFiles: newEngineFiles(tmp, os.O_RDWR, o.Engine, o.Progress)}
	err = fill(w)
	if cerr := w.close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = commit(tmp, abs, !o.NotDurable)
	}
	if err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("checkpoint: save %s: %w", path, err)
	}
	return w, nil
}
