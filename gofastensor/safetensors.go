package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/pyfastensor/pyfastensor/checkpoint"
	"github.com/pyfastensor/pyfastensor/gds"
)

// safetensors files: save tensors from caller memory (the layout is
// checkpoint.LayoutSafetensors'); open a file, its validated header as
// JSON, for the caller to read its tensors with pft_raw_read from the
// file it pins. Python (pyfastensor/safetensors.py) knows torch dtypes,
// nothing of the format.

// safetensorsSpec is the JSON argument of pft_safetensors_save: the
// tensors (name, dtype name, shape, size in bytes) and the metadata, in
// the caller's order (null: no "__metadata__"; []: an empty one).
type safetensorsSpec struct {
	Tensors  []checkpoint.STensor   `json:"tensors"`
	Metadata []checkpoint.MetaEntry `json:"metadata"`
}

// pft_safetensors_save writes a safetensors file at path, with the commit
// protocol of pft_ckpt_save_torch. spec is JSON: {"tensors": [{"name", "dtype",
// "shape", "size"}, ...], "metadata": [{"key", "value"}, ...] or null};
// addrs holds n addresses, the memory of each tensor (size bytes), read
// during the call only. options, progress as for pft_ckpt_save_torch. out: the
// stats, JSON.
//
//export pft_safetensors_save
func pft_safetensors_save(path, spec *C.char, n C.int64_t, addrs *unsafe.Pointer, options *C.char,
	progress *C.int64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		var s safetensorsSpec
		if err := parseJSON(spec, &s); err != nil {
			return err
		}
		if int64(n) != int64(len(s.Tensors)) || (n > 0 && addrs == nil) {
			return fmt.Errorf("%w: %d addresses for %d tensors", gds.ErrInvalid, n, len(s.Tensors))
		}
		if n > 0 {
			for i, a := range unsafe.Slice(addrs, n) {
				t := &s.Tensors[i]
				if t.Size < 0 {
					return fmt.Errorf("%w: tensor %q: size %d", gds.ErrInvalid, t.Name, t.Size)
				}
				p, err := memory(a, C.size_t(t.Size))
				if err != nil {
					return fmt.Errorf("tensor %q: %w", t.Name, err)
				}
				t.Data = p
			}
		}
		o, err := writeOptions(options, progress)
		if err != nil {
			return err
		}
		st, err := checkpoint.SaveSafetensors(C.GoString(path), s.Tensors, s.Metadata, o)
		if err != nil {
			return err
		}
		return putJSON(out, st)
	})
}

// pft_safetensors_stage_begin lays out a safetensors file at path for a
// staged save, as pft_safetensors_save lays it out, creates its temporary
// file and writes the header and every tensor not marked in staged (from
// its address, read during the call only); handle receives the save's
// handle, whose pft_ckpt_stage_write parts are by tensor (index in spec's
// tensors; addrs[k] is ignored where staged[k] is non-zero), then
// pft_ckpt_stage_commit or pft_ckpt_stage_abort. spec, options as for
// pft_safetensors_save.
//
//export pft_safetensors_stage_begin
func pft_safetensors_stage_begin(path, spec *C.char, n C.int64_t, addrs *unsafe.Pointer, staged *C.int, options *C.char,
	handle *C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		var s safetensorsSpec
		if err := parseJSON(spec, &s); err != nil {
			return err
		}
		if int64(n) != int64(len(s.Tensors)) || (n > 0 && (addrs == nil || staged == nil)) {
			return fmt.Errorf("%w: %d addresses and staged flags for %d tensors", gds.ErrInvalid, n, len(s.Tensors))
		}
		flags := make([]bool, len(s.Tensors))
		if n > 0 {
			as, st := unsafe.Slice(addrs, n), unsafe.Slice(staged, n)
			for i := range s.Tensors {
				t := &s.Tensors[i]
				if flags[i] = st[i] != 0; flags[i] {
					continue
				}
				if t.Size < 0 {
					return fmt.Errorf("%w: tensor %q: size %d", gds.ErrInvalid, t.Name, t.Size)
				}
				p, err := memory(as[i], C.size_t(t.Size))
				if err != nil {
					return fmt.Errorf("tensor %q: %w", t.Name, err)
				}
				t.Data = p
			}
		}
		o, err := writeOptions(options, nil)
		if err != nil {
			return err
		}
		r, err := checkpoint.BeginStagedSafetensors(C.GoString(path), s.Tensors, s.Metadata, flags, o)
		if err != nil {
			return err
		}
		*handle = newHandle(stagedSave(rawStaged{r}))
		return nil
	})
}

// pft_safetensors_open parses and validates the header of the
// safetensors file at path (checkpoint.OpenSafetensors) and keeps the file
// open; out receives {"path", "file_size", "tensors": [{"name", "dtype",
// "shape", "begin", "end"}, ...] (file offsets, in the header's order),
// "metadata", "data_start", "fd"} as JSON, and handle a handle for
// pft_safetensors_close. The caller reads the tensors from
// /proc/self/fd/<fd>, the file parsed, while the handle is open.
//
//export pft_safetensors_open
func pft_safetensors_open(path *C.char, handle *C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		f, err := checkpoint.OpenSafetensors(C.GoString(path))
		if err != nil {
			return err
		}
		if err := putJSON(out, f); err != nil {
			f.Close()
			return err
		}
		*handle = newHandle(f)
		return nil
	})
}

//export pft_safetensors_close
func pft_safetensors_close(h C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		f, err := release[*checkpoint.SafetensorsFile](h)
		if err != nil {
			return err
		}
		return f.Close()
	})
}

// safetensorsLayout is what pft_safetensors_layout returns: the header
// (base64, as encoding/json writes bytes), each tensor's offset in the
// caller's order, and the size in all.
type safetensorsLayout struct {
	Header  []byte  `json:"header"`
	Offsets []int64 `json:"offsets"`
	Size    int64   `json:"size"`
}

// pft_safetensors_layout lays out, without writing anything, the
// safetensors bytes of the tensors and metadata of spec (as for
// pft_safetensors_save) with the safetensors package's own alignment:
// what safetensors.torch.save returns, for the caller to fill in memory.
// out: {"header": base64, "offsets": [...], "size": n}.
//
//export pft_safetensors_layout
func pft_safetensors_layout(spec *C.char, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		var s safetensorsSpec
		if err := parseJSON(spec, &s); err != nil {
			return err
		}
		header, offsets, size, err := checkpoint.LayoutSafetensors(s.Tensors, s.Metadata, checkpoint.SafetensorsPackageAlign)
		if err != nil {
			return err
		}
		return putJSON(out, safetensorsLayout{Header: header, Offsets: offsets, Size: size})
	})
}

// pft_safetensors_parse parses and validates the safetensors bytes at
// data (n bytes, read during the call only; name is what errors call
// them) as checkpoint.ParseSafetensorsHeader does a file's. out: the
// header as JSON, as pft_safetensors_open gives it, offsets from the
// start of data.
//
//export pft_safetensors_parse
func pft_safetensors_parse(name *C.char, data unsafe.Pointer, n C.int64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		if n < 0 {
			return fmt.Errorf("%w: safetensors: %d bytes", gds.ErrInvalid, int64(n))
		}
		p, err := memory(data, C.size_t(n))
		if err != nil {
			return err
		}
		h, err := checkpoint.ParseSafetensorsHeader(C.GoString(name), p, int64(n))
		if err != nil {
			return err
		}
		return putJSON(out, h)
	})
}
