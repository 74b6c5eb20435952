package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// WriteOptions tune Save. The zero value is a durable save with the
// default chooser.
type WriteOptions struct {
	// NotDurable skips the fsyncs of the commit (transfer/commit.go).
	NotDurable bool
	// Chooser picks each large record's engine; nil means
	// transfer.Default(directory of the target).
	Chooser transfer.Chooser
	// Engine holds the engines' options.
	Engine gds.Options
	// Workers is the number of transfers in flight; 0 means
	// transfer.WriteWorkers.
	Workers int
	// Progress, when not nil, is called with each count of data bytes
	// written, as they are written, from several goroutines.
	Progress func(n int64)
	// FS is the filesystem the commit goes through; nil means the real
	// one (tests inject faults and crashes here).
	FS transfer.FS
	// NoCRC writes 0 in every record's CRC-32 field and sums nothing, as
	// torch.save does under torch.serialization.set_crc32_options(False):
	// a load then has nothing to check (Entry.Unchecked).
	NoCRC bool
}

func (o WriteOptions) transferOptions() transfer.Options {
	return transfer.Options{Chooser: o.Chooser, Engine: o.Engine, Workers: o.Workers, Progress: o.Progress}
}

// Stats describe a finished save or load.
type Stats struct {
	FileBytes int64            `json:"file_bytes"`
	DataBytes int64            `json:"data_bytes"`
	Engines   map[string]int64 `json:"engines"` // data bytes per engine
	Seconds   float64          `json:"seconds"`
}

// Save writes recs, in order, as a zip archive at path, through a
// temporary file committed as transfer/commit.go describes. The records'
// Data is only read during the call.
//
// On error nothing new is left at path (the previous file, if any, is
// untouched) and the temporary file is removed.
func Save(path string, recs []Record, o WriteOptions) (st Stats, err error) {
	start := time.Now()
	if err := checkNames(recs); err != nil {
		return st, err
	}
	l := plan(recs)
	l.noCRC = o.NoCRC
	w, err := transfer.Create(path, l.total, !o.NotDurable, o.FS, o.transferOptions())
	if err != nil {
		return st, fmt.Errorf("checkpoint: save %s: %w", path, err)
	}
	if err := write(w, &l, nil); err != nil {
		w.Abort()
		return st, fmt.Errorf("checkpoint: save %s: %w", path, err)
	}
	tst, err := w.Commit()
	if err != nil {
		return st, fmt.Errorf("checkpoint: save %s: %w", path, err)
	}
	st = Stats{FileBytes: l.total, Engines: tst.Engines, Seconds: time.Since(start).Seconds()}
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

// write moves everything in two transfers. First, in one queue, the
// extents (records of transfer.ExtentMin and up, straight from their
// memory through their chosen engine, each piece summed as it is written)
// and the runs of headers, small records and their descriptors between
// them (composed one task at a time in aligned memory, each small record
// summed right after it is copied, while it is in the CPU's cache, and
// written through the engine the chooser gives their size): the device's
// queue stays full from the first byte to the last. Then what needs the
// extents' CRC-32s: their descriptors and the central directory, through
// the page cache (a few bytes each, after the direct writes of the blocks
// they share have landed). Records with written[i] set had their data
// written before (a staged save's parts) and their CRC-32 set: they are
// written as extents are, less the data. written may be nil.
func write(w *transfer.Writer, l *layout, written []bool) error {
	recs := l.recs
	var exts []transfer.Extent
	var largeAt, doneAt []int
	inExtent := make([]bool, len(recs))
	for i := range recs {
		if written != nil && written[i] {
			doneAt = append(doneAt, i)
			inExtent[i] = true
		} else if recs[i].size() >= transfer.ExtentMin {
			exts = append(exts, transfer.Extent{Off: recs[i].dataOff, Data: recs[i].Data, Sum: !l.noCRC})
			largeAt = append(largeAt, i)
			inExtent[i] = true
		}
	}
	for _, r := range runs(l, inExtent) {
		exts = append(exts, transfer.Extent{Off: r.off, Len: r.n,
			Build: func(p []byte) int64 { return r.compose(recs, p) }})
	}
	res, err := w.Write(exts)
	if err != nil {
		var ee *transfer.ExtentError
		if errors.As(err, &ee) && ee.Ext < len(largeAt) {
			return fmt.Errorf("record %q: %w", recs[largeAt[ee.Ext]].Name, ee.Err)
		}
		return err
	}
	for k, i := range largeAt {
		recs[i].crc = res[k].CRC
	}
	if l.noCRC {
		for i := range recs {
			recs[i].crc = 0
		}
	}
	var last []transfer.Extent
	described := append(largeAt, doneAt...)
	for _, i := range described {
		p := &recs[i]
		d := descriptor(p.hdrOff, p.size(), p.crc)
		last = append(last, transfer.Extent{Off: p.descOff, Len: int64(len(d)), Engine: "posix",
			Build: func(b []byte) int64 { copy(b, d); return 0 }}) // not data: no progress
	}
	cd := central(l)
	last = append(last, transfer.Extent{Off: l.cdOff, Len: int64(len(cd)), Engine: "posix",
		Build: func(p []byte) int64 { copy(p, cd); return 0 }})
	if _, err = w.Write(last); err != nil {
		var ee *transfer.ExtentError
		if errors.As(err, &ee) && ee.Ext < len(described) {
			return fmt.Errorf("record %q: descriptor: %w", recs[described[ee.Ext]].Name, ee.Err)
		}
		return fmt.Errorf("central directory: %w", err)
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
	noCRC  bool // the layout's: sum nothing, write 0
}

// runs groups everything before the central directory that is not an
// extent into runs of about transfer.RunMax bytes. A full run ends before
// the data of a record aligned to transfer.Alignment, so runs meet on block
// boundaries and a direct write of one needs no read-modify-write of a
// block its neighbour writes (a run of unaligned records ends before a
// header at twice the size). A record's descriptor is always in the run of
// its data, which computes the CRC-32 it holds; an extent's is not in any.
func runs(l *layout, inExtent []bool) []run {
	var out []run
	var cur *run
	add := func(off, n int64, s span) {
		if n == 0 {
			return
		}
		full := cur != nil && cur.n+n > transfer.RunMax &&
			(s.kind == 'd' && off%transfer.Alignment == 0 || s.kind == 'h' && cur.n+n > 2*transfer.RunMax)
		if cur == nil || cur.off+cur.n != off || full {
			out = append(out, run{off: off, noCRC: l.noCRC})
			cur = &out[len(out)-1]
		}
		cur.n += n
		cur.spans = append(cur.spans, s)
	}
	for i, r := range l.recs {
		add(r.hdrOff, r.dataOff-r.hdrOff, span{i, 'h'})
		if !inExtent[i] { // an extent's descriptor waits for its CRC-32 (write)
			add(r.dataOff, r.size(), span{i, 'd'})
			add(r.descOff, r.end-r.descOff, span{i, 'x'})
		}
	}
	return out
}

// compose writes a run's bytes into buf (r.n long), summing each record's
// data just after copying it, and returns how many bytes are record data.
func (r run) compose(recs []placed, buf []byte) int64 {
	at := 0
	var data int64
	for _, s := range r.spans {
		p := &recs[s.rec]
		switch s.kind {
		case 'h':
			at += copy(buf[at:], localHeader(p.Name, p.hdrOff, p.size(), p.pad))
		case 'd':
			n := copy(buf[at:], p.Data)
			if !r.noCRC {
				p.crc = transfer.Checksum(buf[at : at+n])
			}
			at += n
			data += p.size()
		case 'x':
			at += copy(buf[at:], descriptor(p.hdrOff, p.size(), p.crc))
		}
	}
	if at != len(buf) { // the layout and its encoders disagree: a bug
		panic(fmt.Sprintf("checkpoint: run at %d composed %d bytes, planned %d", r.off, at, len(buf)))
	}
	return data
}

// central encodes the central directory, the end records and the comment
// carrying their CRC-32.
func central(l *layout) []byte {
	b := make([]byte, 0, l.total-l.cdOff)
	for _, p := range l.recs {
		b = centralEntry(b, p.Name, p.hdrOff, p.size(), p.crc)
	}
	b = append(b, endRecords(len(l.recs), l.cdOff, l.cdSize, cdCommentLen)...)
	return append(b, fmt.Sprintf("%s%08x", cdCommentPrefix, transfer.Checksum(b))...)
}

// le is shorthand for the zip's byte order.
var le = binary.LittleEndian
