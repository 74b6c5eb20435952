package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer/dict"
)

// The adaptive dictionaries (dict.Dictionaries) behind engine choice: where
// their file lives, open/decide/observe/save/close by handle, reading a file
// for display. Structured arguments and results cross as JSON. (The
// hit-rate benchmark is cmd/dicthitrate, not part of the library.)

// dictOpenConfig is pft_dict_open's JSON argument.
type dictOpenConfig struct {
	Mode           string   `json:"mode"` // "aware" (default), "dict", "tool"
	Tool           string   `json:"tool"`
	Path           string   `json:"path"` // "" keeps the dictionaries in memory
	Dir            string   `json:"dir"`  // the filesystem served: candidates and key
	Write          []string `json:"write"`
	Read           []string `json:"read"`
	Explore        int      `json:"explore"`
	Refresh        int      `json:"refresh"`
	Alpha          float64  `json:"alpha"`
	SaveIntervalMs int64    `json:"save_interval_ms"` // 0 default, negative only at save/close
}

// dictState is what a handle holds.
type dictState struct {
	d        *dict.Dictionaries
	views    [4]*dict.DictChooser // by use: 0 separate, 1 write+read, 2 write, 3 read
	excluded map[string]string
}

// pft_dict_path returns, as JSON, the dictionary file of the filesystem
// holding dir inside cacheDir, and the machine key it is named after:
// {"path": ..., "key": {...}}.
//
//export pft_dict_path
func pft_dict_path(cacheDir, dir *C.char, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		p, key, err := dict.DictPath(C.GoString(cacheDir), C.GoString(dir))
		if err != nil {
			return err
		}
		return putJSON(out, map[string]any{"path": p, "key": key})
	})
}

// pft_dict_open opens dictionaries (config: dictOpenConfig as JSON). Without
// write or read candidates, those of dir are used.
//
//export pft_dict_open
func pft_dict_open(config *C.char, out *C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		var oc dictOpenConfig
		if err := parseJSON(config, &oc); err != nil {
			return err
		}
		mode := dict.ModeAware
		if oc.Mode != "" {
			m, err := dict.ParseMode(oc.Mode)
			if err != nil {
				return err
			}
			mode = m
		}
		cfg := dict.DictConfig{Mode: mode, Tool: oc.Tool, Path: oc.Path, Write: oc.Write, Read: oc.Read,
			Explore: oc.Explore, Refresh: oc.Refresh, Alpha: oc.Alpha, SaveInterval: time.Duration(oc.SaveIntervalMs) * time.Millisecond}
		st := &dictState{}
		if oc.Dir != "" {
			key, err := dict.MachineKeyFor(oc.Dir)
			if err != nil {
				return err
			}
			cfg.Key = key
			if cfg.Write == nil || cfg.Read == nil {
				w, r, ex := dict.Candidates(oc.Dir, gds.Options{})
				st.excluded = ex
				if cfg.Write == nil {
					cfg.Write = w
				}
				if cfg.Read == nil {
					cfg.Read = r
				}
			}
		}
		d, err := dict.OpenDictionaries(cfg)
		if err != nil {
			return err
		}
		st.d = d
		st.views = [4]*dict.DictChooser{d.Chooser(dict.UseSeparate), d.Chooser(dict.UseWriteRead),
			d.Chooser(dict.UseWrite), d.Chooser(dict.UseRead)}
		*out = newHandle(st)
		return nil
	})
}

func dictView(h C.uint64_t, use C.int) (*dictState, *dict.DictChooser, error) {
	st, err := lookup[*dictState](h)
	if err != nil {
		return nil, nil, err
	}
	if use < 0 || int(use) >= len(st.views) {
		return nil, nil, fmt.Errorf("%w: use %d (0 separate, 1 write+read, 2 write, 3 read)", gds.ErrInvalid, int(use))
	}
	return st, st.views[use], nil
}

func dictOp(op C.int) (dict.Op, error) {
	if op != 0 && op != 1 {
		return 0, fmt.Errorf("%w: op %d (0 write, 1 read)", gds.ErrInvalid, int(op))
	}
	return dict.Op(op), nil
}

// pft_dict_decide returns, as JSON, the engine for a transfer of size bytes
// (op: 0 write, 1 read) as the view use names it (0: WDic/RDic, 1: WRDic):
// {"engine", "bucket", "exploring", "reason"}.
//
//export pft_dict_decide
func pft_dict_decide(h C.uint64_t, use, op C.int, size C.int64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		_, v, err := dictView(h, use)
		if err != nil {
			return err
		}
		o, err := dictOp(op)
		if err != nil {
			return err
		}
		return putJSON(out, v.Decide(o, int64(size)))
	})
}

// pft_dict_observe reports that a transfer of size bytes took nanos
// nanoseconds with engine.
//
//export pft_dict_observe
func pft_dict_observe(h C.uint64_t, op C.int, size C.int64_t, engine *C.char, nanos C.int64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		_, v, err := dictView(h, 0)
		if err != nil {
			return err
		}
		o, err := dictOp(op)
		if err != nil {
			return err
		}
		v.Observe(o, int64(size), C.GoString(engine), time.Duration(nanos))
		return nil
	})
}

// pft_dict_describe returns, as JSON, the dictionaries in their file layout,
// the load warnings, the candidates and the engines left out with reasons.
//
//export pft_dict_describe
func pft_dict_describe(h C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		st, err := lookup[*dictState](h)
		if err != nil {
			return err
		}
		cfg := st.d.Config()
		return putJSON(out, map[string]any{
			"dictionaries": st.d.Snapshot(), "warnings": st.d.Warnings(), "path": cfg.Path,
			"mode": cfg.Mode.String(), "write": cfg.Write, "read": cfg.Read, "excluded": st.excluded,
		})
	})
}

//export pft_dict_save
func pft_dict_save(h C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		st, err := lookup[*dictState](h)
		if err != nil {
			return err
		}
		return st.d.Save()
	})
}

// pft_dict_close releases the handle and saves changed dictionaries.
//
//export pft_dict_close
func pft_dict_close(h C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		st, err := release[*dictState](h)
		if err != nil {
			return err
		}
		return st.d.Close()
	})
}

// pft_dict_load reads a dictionary file for display, tolerantly (see
// dict.ReadDictFile): {"dictionaries": {...}, "warnings": [...]}.
//
//export pft_dict_load
func pft_dict_load(path *C.char, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		doc, warnings, err := dict.ReadDictFile(C.GoString(path))
		if err != nil {
			return err
		}
		return putJSON(out, map[string]any{"dictionaries": doc, "warnings": warnings})
	})
}
