package checkpoint

import (
	"errors"
	"fmt"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// StagedRaw is a save of a raw file (a safetensors file) some of whose
// extents arrive in parts: the file is created and its other extents
// written first (BeginStagedRaw), the staged extents' bytes written part
// after part (WriteParts) from a staging buffer reused between parts, and
// the file committed as SaveRaw commits (Commit) once each is whole. It
// serves a save of CUDA tensors through a bounded pinned ring.
//
// Not safe for concurrent use. The file holds the bytes SaveRaw would
// write for the same extents.
type StagedRaw struct {
	path    string
	w       *transfer.Writer
	spans   []RawSpan
	written []int64 // bytes of each span written so far
	size    int64
	start   time.Time
	done    bool
}

// RawSpan is a staged extent: Size bytes at file offset Off.
type RawSpan struct {
	Off, Size int64
}

// BeginStagedRaw creates the temporary file of a size-byte file for path
// and writes fixed (read during the call only); the spans' bytes come
// later, through WriteParts.
func BeginStagedRaw(path string, size int64, fixed []Extent, spans []RawSpan, o WriteOptions) (*StagedRaw, error) {
	for i, sp := range spans {
		if sp.Off < 0 || sp.Size < 0 || sp.Off+sp.Size > size {
			return nil, fmt.Errorf("%w: checkpoint: staged save %s: span %d of %d bytes at %d in a file of %d",
				gds.ErrInvalid, path, i, sp.Size, sp.Off, size)
		}
	}
	w, err := transfer.Create(path, size, !o.NotDurable, o.FS, o.transferOptions())
	if err != nil {
		return nil, fmt.Errorf("checkpoint: save %s: %w", path, err)
	}
	s := &StagedRaw{path: path, w: w, spans: spans, written: make([]int64, len(spans)), size: size, start: time.Now()}
	if len(fixed) > 0 {
		if _, err := w.Write(fixed); err != nil {
			w.Abort()
			return nil, fmt.Errorf("checkpoint: save %s: %w", path, err)
		}
	}
	return s, nil
}

// WriteParts writes parts of staged spans (Part.Rec: the span's index,
// Part.Off: the offset within it) in one transfer. Parts of a span come
// in order, here and from call to call. The memory is read during the
// call only. On error the save is to be aborted.
func (s *StagedRaw) WriteParts(parts []Part) error {
	if s.done {
		return fmt.Errorf("%w: checkpoint: staged save %s: part after commit or abort", gds.ErrInvalid, s.path)
	}
	next := map[int]int64{}
	exts := make([]Extent, 0, len(parts))
	for _, p := range parts {
		if p.Rec < 0 || p.Rec >= len(s.spans) {
			return fmt.Errorf("%w: checkpoint: staged save %s: span %d of %d", gds.ErrInvalid, s.path, p.Rec, len(s.spans))
		}
		sp := s.spans[p.Rec]
		at, seen := next[p.Rec]
		if !seen {
			at = s.written[p.Rec]
		}
		if p.Off != at || p.Off+int64(len(p.Data)) > sp.Size {
			return fmt.Errorf("%w: checkpoint: staged save %s: span %d: part of %d bytes at %d, after %d of its %d bytes",
				gds.ErrInvalid, s.path, p.Rec, len(p.Data), p.Off, at, sp.Size)
		}
		next[p.Rec] = at + int64(len(p.Data))
		if len(p.Data) > 0 {
			exts = append(exts, Extent{Off: sp.Off + p.Off, Data: p.Data})
		}
	}
	if len(exts) > 0 {
		if _, err := s.w.Write(exts); err != nil {
			var ee *transfer.ExtentError
			if errors.As(err, &ee) {
				return fmt.Errorf("checkpoint: save %s at %d: %w", s.path, ee.Off, err)
			}
			return fmt.Errorf("checkpoint: save %s: %w", s.path, err)
		}
	}
	for k, n := range next {
		s.written[k] = n
	}
	return nil
}

// Commit commits the file once every span is whole; on error nothing new
// is left at path.
func (s *StagedRaw) Commit() (Stats, error) {
	if s.done {
		return Stats{}, fmt.Errorf("%w: checkpoint: staged save %s: commit after commit or abort", gds.ErrInvalid, s.path)
	}
	var data int64
	for i, sp := range s.spans {
		if s.written[i] != sp.Size {
			s.Abort()
			return Stats{}, fmt.Errorf("%w: checkpoint: staged save %s: span %d has %d of its %d bytes",
				gds.ErrInvalid, s.path, i, s.written[i], sp.Size)
		}
		data += sp.Size
	}
	s.done = true
	tst, err := s.w.Commit()
	if err != nil {
		return Stats{}, fmt.Errorf("checkpoint: save %s: %w", s.path, err)
	}
	return Stats{FileBytes: s.size, DataBytes: data, Engines: tst.Engines, Seconds: time.Since(s.start).Seconds()}, nil
}

// Abort drops the save: the temporary file is removed, path untouched.
func (s *StagedRaw) Abort() {
	if s.done {
		return
	}
	s.done = true
	s.w.Abort()
}

// BeginStagedSafetensors begins a staged save of a safetensors file at
// path, laid out as SaveSafetensors lays it out: the tensors marked in
// staged come later in parts (their Data must be nil), the header and the
// others are written now from their Data. WriteParts' span k is tensor k;
// those not staged are whole already.
func BeginStagedSafetensors(path string, tensors []STensor, metadata []MetaEntry, staged []bool, o WriteOptions) (*StagedRaw, error) {
	if len(staged) != len(tensors) {
		return nil, fmt.Errorf("%w: safetensors: %d staged flags for %d tensors", gds.ErrInvalid, len(staged), len(tensors))
	}
	header, offsets, size, err := LayoutSafetensors(tensors, metadata, SafetensorsFileAlign(tensors))
	if err != nil {
		return nil, err
	}
	fixed := []Extent{{Off: 0, Data: header}}
	spans := make([]RawSpan, len(tensors))
	for i := range tensors {
		t := &tensors[i]
		spans[i] = RawSpan{Off: offsets[i], Size: t.Size}
		if staged[i] {
			if t.Data != nil {
				return nil, fmt.Errorf("%w: safetensors: staged tensor %q comes with data", gds.ErrInvalid, t.Name)
			}
			continue
		}
		if int64(len(t.Data)) != t.Size {
			return nil, fmt.Errorf("%w: safetensors: tensor %q: %d bytes of data for a size of %d",
				gds.ErrInvalid, t.Name, len(t.Data), t.Size)
		}
		if t.Size > 0 {
			fixed = append(fixed, Extent{Off: offsets[i], Data: t.Data})
		}
	}
	s, err := BeginStagedRaw(path, size, fixed, spans, o)
	if err != nil {
		return nil, err
	}
	for i := range tensors {
		if !staged[i] {
			s.written[i] = tensors[i].Size
		}
	}
	return s, nil
}
