package main

/*
#include <stdint.h>
*/
import "C"

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/pyfastensor/pyfastensor/checkpoint"
	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
	"github.com/pyfastensor/pyfastensor/transfer/dict"
)

// ioOptions is the one options argument of every export that moves data
// (saves, reads, stores, engine files): a JSON object, always the argument
// after the data's own (paths, arrays) and before the progress counter and
// results. NULL or "{}" means every default. Unknown keys are refused, so a
// misspelt option fails instead of being ignored.
type ioOptions struct {
	// Engine names one engine for every transfer; "" leaves the choice to
	// the data path (or to Dict).
	Engine string `json:"engine"`
	// Dict, a pft_dict_open handle, lets those adaptive dictionaries choose
	// the engine of every transfer instead (0: none), through the view
	// DictUse names (pft_dict_decide's use: 0 WDic for writes and RDic for
	// reads, 1 WRDic, 2 WDic, 3 RDic).
	Dict    uint64 `json:"dict"`
	DictUse int    `json:"dict_use"`
	// Threads, TaskSize and QueueDepth tune an engine (gds.Options; 0: its
	// default); CufileLibrary names the libcufile of the cufile engine
	// ("": the one the library resolved).
	Threads       int    `json:"threads"`
	TaskSize      int64  `json:"task_size"`
	QueueDepth    int    `json:"queue_depth"`
	CufileLibrary string `json:"cufile_library"`
	// Workers is the number of transfers in flight (0: the data path's
	// default).
	Workers int `json:"workers"`
	// Durable (saves; default true) commits with fsyncs; Verify (reads;
	// default true) checks every byte read against its checksum.
	Durable bool `json:"durable"`
	Verify  bool `json:"verify"`
	// CRC32 (saves of torch's format; default true) sums each record and
	// writes its CRC-32; false writes 0, as torch.save does under
	// torch.serialization.set_crc32_options(False).
	CRC32 bool `json:"crc32"`
}

// parseOptions reads an options argument (NULL: the defaults).
func parseOptions(s *C.char) (ioOptions, error) {
	if s == nil {
		return decodeOptions("")
	}
	return decodeOptions(C.GoString(s))
}

// decodeOptions reads options from their JSON text ("": the defaults).
func decodeOptions(text string) (ioOptions, error) {
	o := ioOptions{Durable: true, Verify: true, CRC32: true}
	if text == "" {
		return o, nil
	}
	d := json.NewDecoder(bytes.NewReader([]byte(text)))
	d.DisallowUnknownFields()
	if err := d.Decode(&o); err != nil {
		return o, fmt.Errorf("%w: options: %v", gds.ErrInvalid, err)
	}
	if d.More() {
		return o, fmt.Errorf("%w: options: more than one JSON value", gds.ErrInvalid)
	}
	return o, o.check()
}

// Bounds of the engine tunings: far above any useful value, low enough
// that a slip (a count of bytes for threads) cannot start a million
// goroutines or cut a transfer into one-byte pieces.
const (
	maxThreads    = 1024
	maxQueueDepth = 4096
	minTaskSize   = 4 << 10
)

// check refuses tunings out of their bounds, naming the option (0 is the
// default of each).
func (o ioOptions) check() error {
	switch {
	case o.Threads < 0 || o.Threads > maxThreads:
		return fmt.Errorf("%w: threads=%d: expected 0 (the default) to %d", gds.ErrInvalid, o.Threads, maxThreads)
	case o.QueueDepth < 0 || o.QueueDepth > maxQueueDepth:
		return fmt.Errorf("%w: queue_depth=%d: expected 0 (the default) to %d", gds.ErrInvalid, o.QueueDepth, maxQueueDepth)
	case o.TaskSize != 0 && o.TaskSize < minTaskSize:
		return fmt.Errorf("%w: task_size=%d: expected 0 (the default) or at least %d bytes", gds.ErrInvalid, o.TaskSize, minTaskSize)
	case o.Workers < 0 || o.Workers > maxThreads:
		return fmt.Errorf("%w: workers=%d: expected 0 (the default) to %d", gds.ErrInvalid, o.Workers, maxThreads)
	}
	return nil
}

// engine is the engine tuning of o.
func (o ioOptions) engine() gds.Options {
	return gds.Options{Threads: o.Threads, TaskSize: o.TaskSize, QueueDepth: o.QueueDepth, CuFileLibrary: o.CufileLibrary}
}

// view is the dictionary view o names, or nil.
func (o ioOptions) view() (*dict.DictChooser, error) {
	if o.Dict == 0 {
		return nil, nil
	}
	_, v, err := dictView(C.uint64_t(o.Dict), C.int(o.DictUse))
	if err != nil {
		return nil, fmt.Errorf("options: dict %d: %w", o.Dict, err)
	}
	return v, nil
}

// chooser is the engine choice of o: nil (the default chooser), the
// dictionaries' view, or one engine for every record.
func (o ioOptions) chooser() (transfer.Chooser, error) {
	if o.Dict != 0 {
		return o.view()
	}
	if o.Engine == "" {
		return nil, nil
	}
	return transfer.Fixed(o.Engine), nil
}

// write is o as the options of a save, counting into progress.
func (o ioOptions) write(progress *C.int64_t) (checkpoint.WriteOptions, error) {
	ch, err := o.chooser()
	return checkpoint.WriteOptions{
		NotDurable: !o.Durable,
		NoCRC:      !o.CRC32,
		Chooser:    ch,
		Engine:     o.engine(),
		Workers:    o.Workers,
		Progress:   progressFunc(progress),
	}, err
}

// read is o as the options of a read (Verify means nothing to raw reads),
// counting into progress.
func (o ioOptions) read(progress *C.int64_t) (checkpoint.ReadOptions, error) {
	ch, err := o.chooser()
	return checkpoint.ReadOptions{
		NoVerify: !o.Verify,
		Chooser:  ch,
		Engine:   o.engine(),
		Workers:  o.Workers,
		Progress: progressFunc(progress),
	}, err
}

// writeOptions parses an options argument as the options of a save.
func writeOptions(options *C.char, progress *C.int64_t) (checkpoint.WriteOptions, error) {
	o, err := parseOptions(options)
	if err != nil {
		return checkpoint.WriteOptions{}, err
	}
	return o.write(progress)
}

// readOptions parses an options argument as the options of a read.
func readOptions(options *C.char, progress *C.int64_t) (checkpoint.ReadOptions, error) {
	o, err := parseOptions(options)
	if err != nil {
		return checkpoint.ReadOptions{}, err
	}
	return o.read(progress)
}
