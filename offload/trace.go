package offload

// G10 traces: what one training iteration does, op by op, with the bytes of
// every tensor it touches. Schema version 1:
//
//	{"version": 1,
//	 "tensors": [{"id": 0, "bytes": 4096, "kind": "weight"}],
//	 "ops": [{"name": "layer1.fwd", "time_ns": 12000, "reads": [0, 3], "writes": [4]}],
//	 "meta": {"op_time": "cuda_events"}}
//
// "meta" is optional and free-form; "tensors" and "ops" are required, as
// are each tensor's id, bytes and kind and each op's name and time_ns
// (reads and writes may be left out). Ops are in execution order. Weights,
// optimizer state and inputs are global: alive from the start of the
// iteration. Any other tensor is alive from the op that first writes it to
// its last use.

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/pyfastensor/pyfastensor/gds"
)

// ErrTrace is wrapped by every error ParseTrace returns: a kind of
// gds.ErrInvalid (a trace handed over is a bad argument).
var ErrTrace = gds.Named(gds.ErrInvalid, "offload: invalid trace")

// ErrCorruptTrace is wrapped, beside ErrTrace, by ReadTrace's error for a
// file that holds no valid trace: a kind of gds.ErrCorrupt.
var ErrCorruptTrace = gds.Named(gds.ErrCorrupt, "offload: corrupt trace file")

// TraceVersion is the only trace schema version this package reads.
const TraceVersion = 1

// Tensor kinds of a trace.
const (
	KindWeight     = "weight"
	KindOptimizer  = "optimizer"
	KindInput      = "input"
	KindActivation = "activation"
	KindGradient   = "gradient"
	KindWorkspace  = "workspace"
)

// TraceKinds lists the tensor kinds of a trace, global ones first.
var TraceKinds = []string{KindWeight, KindOptimizer, KindInput, KindActivation, KindGradient, KindWorkspace}

var traceKinds = map[string]bool{
	KindWeight: true, KindOptimizer: true, KindInput: true,
	KindActivation: true, KindGradient: true, KindWorkspace: true,
}

// GlobalKind reports whether tensors of kind are alive from the start of
// the iteration (weights, optimizer state, inputs).
func GlobalKind(kind string) bool {
	return kind == KindWeight || kind == KindOptimizer || kind == KindInput
}

// TraceTensor is one tensor of a trace.
type TraceTensor struct {
	ID    int    `json:"id"`
	Bytes int64  `json:"bytes"`
	Kind  string `json:"kind"`
}

// UnmarshalJSON decodes a tensor whose id, bytes and kind are all given
// (a missing or misspelt one would read as 0 or "").
func (x *TraceTensor) UnmarshalJSON(b []byte) error {
	var raw struct {
		ID    *int    `json:"id"`
		Bytes *int64  `json:"bytes"`
		Kind  *string `json:"kind"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	if miss := missing(map[string]bool{"id": raw.ID == nil, "bytes": raw.Bytes == nil, "kind": raw.Kind == nil}); miss != "" {
		return fmt.Errorf("a tensor without %s: %s", miss, excerpt(b))
	}
	*x = TraceTensor{ID: *raw.ID, Bytes: *raw.Bytes, Kind: *raw.Kind}
	return nil
}

// TraceOp is one op (kernel) of a trace, with the tensor ids it uses.
type TraceOp struct {
	Name   string `json:"name"`
	TimeNs int64  `json:"time_ns"`
	Reads  []int  `json:"reads"`
	Writes []int  `json:"writes"`
}

// UnmarshalJSON decodes an op whose name and time_ns are given (reads and
// writes may be absent: none).
func (op *TraceOp) UnmarshalJSON(b []byte) error {
	var raw struct {
		Name   *string `json:"name"`
		TimeNs *int64  `json:"time_ns"`
		Reads  []int   `json:"reads"`
		Writes []int   `json:"writes"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	if miss := missing(map[string]bool{"name": raw.Name == nil, "time_ns": raw.TimeNs == nil}); miss != "" {
		return fmt.Errorf("an op without %s: %s", miss, excerpt(b))
	}
	*op = TraceOp{Name: *raw.Name, TimeNs: *raw.TimeNs, Reads: raw.Reads, Writes: raw.Writes}
	return nil
}

// missing names the fields marked absent, sorted, quoted ("" for none).
func missing(absent map[string]bool) string {
	var names []string
	for name, gone := range absent {
		if gone {
			names = append(names, strconv.Quote(name))
		}
	}
	sort.Strings(names)
	return strings.Join(names, " and ")
}

// excerpt is the start of a JSON value, for an error naming it.
func excerpt(b []byte) string {
	const most = 120
	if len(b) > most {
		return string(b[:most]) + "..."
	}
	return string(b)
}

// Trace is one training iteration.
type Trace struct {
	Version int           `json:"version"`
	Tensors []TraceTensor `json:"tensors"`
	Ops     []TraceOp     `json:"ops"`
	// Meta is free-form notes on how the trace was made (the recorder
	// says how it timed the ops); nothing reads it. Empty reads as absent.
	Meta map[string]any `json:"meta,omitempty"`
}

// maxTraceNs bounds an iteration's time: 2^53 ns, the last count of
// nanoseconds a float64 clock holds exactly.
const maxTraceNs = 1 << 53

func traceErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrTrace, fmt.Sprintf(format, a...))
}

// ParseTrace decodes and validates a version 1 trace. Unknown fields are
// ignored (the schema may grow); trailing data is an error.
func ParseTrace(data []byte) (*Trace, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw struct {
		Trace
		Tensors *[]TraceTensor `json:"tensors"`
		Ops     *[]TraceOp     `json:"ops"`
	}
	if err := dec.Decode(&raw); err != nil {
		return nil, traceErr("decoding JSON: %v", err)
	}
	if raw.Tensors == nil || raw.Ops == nil {
		return nil, traceErr("no \"tensors\" or no \"ops\" list (both are required, empty or not)")
	}
	t := raw.Trace
	t.Tensors, t.Ops = *raw.Tensors, *raw.Ops
	if _, err := dec.Token(); err != io.EOF {
		return nil, traceErr("trailing data after the trace object")
	}
	if len(t.Meta) == 0 {
		t.Meta = nil
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return &t, nil
}

// ReadTrace reads and parses the trace file at path, JSON or gzip-compressed
// JSON (told apart by gzip's magic bytes, whatever the file's name). Errors
// name the path; a file that does not decompress, parse or validate wraps
// ErrCorruptTrace and ErrTrace.
func ReadTrace(path string) (*Trace, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("offload: reading trace: %w", err)
	}
	if len(data) >= 2 && data[0] == 0x1f && data[1] == 0x8b {
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err == nil {
			data, err = io.ReadAll(zr)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrCorruptTrace, path, traceErr("decompressing gzip: %v", err))
		}
	}
	t, err := ParseTrace(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrCorruptTrace, path, err)
	}
	return t, nil
}

// Validate checks a trace built in Go the way ParseTrace checks a decoded
// one; errors wrap ErrTrace and name the op or tensor at fault.
func (t *Trace) Validate() error {
	if t.Version != TraceVersion {
		return traceErr("version %d, want %d", t.Version, TraceVersion)
	}
	kind := make(map[int]string, len(t.Tensors))
	var totalBytes, totalNs int64
	for i, x := range t.Tensors {
		if x.ID < 0 {
			return traceErr("tensor %d (entry %d): negative id", x.ID, i)
		}
		if _, dup := kind[x.ID]; dup {
			return traceErr("tensor %d (entry %d): duplicate id", x.ID, i)
		}
		if x.Bytes < 0 {
			return traceErr("tensor %d: negative size %d bytes", x.ID, x.Bytes)
		}
		if !traceKinds[x.Kind] {
			return traceErr("tensor %d: unknown kind %q", x.ID, x.Kind)
		}
		if x.Bytes > math.MaxInt64-totalBytes {
			return traceErr("tensor %d: total tensor bytes overflow int64", x.ID)
		}
		totalBytes += x.Bytes
		kind[x.ID] = x.Kind
	}
	written := make(map[int]bool, len(t.Tensors))
	for i, op := range t.Ops {
		if op.TimeNs < 0 {
			return traceErr("op %d (%q): negative time_ns %d", i, op.Name, op.TimeNs)
		}
		if op.TimeNs > math.MaxInt64-totalNs {
			return traceErr("op %d (%q): total time_ns overflows int64", i, op.Name)
		}
		totalNs += op.TimeNs
		if totalNs > maxTraceNs {
			return traceErr("op %d (%q): total time_ns %d is over 2^53 ns (104 days an iteration): the simulator's clock could not count single nanoseconds", i, op.Name, totalNs)
		}
		for _, l := range []struct {
			what string
			ids  []int
		}{{"reads", op.Reads}, {"writes", op.Writes}} {
			seen := make(map[int]bool, len(l.ids))
			for _, id := range l.ids {
				if _, ok := kind[id]; !ok {
					return traceErr("op %d (%q) %s tensor %d, which the trace does not declare", i, op.Name, l.what, id)
				}
				if seen[id] {
					return traceErr("op %d (%q) lists tensor %d twice in %s", i, op.Name, id, l.what)
				}
				seen[id] = true
			}
		}
		for _, id := range op.Reads {
			if !written[id] && !GlobalKind(kind[id]) {
				return traceErr("op %d (%q) reads %s tensor %d before any op writes it", i, op.Name, kind[id], id)
			}
		}
		for _, id := range op.Writes {
			written[id] = true
		}
	}
	return nil
}

// Marshal encodes the trace as JSON (schema version 1).
func (t *Trace) Marshal() ([]byte, error) {
	return json.Marshal(t)
}

// opStarts returns each op's start time and the iteration's total time
// (ideal: no stalls).
func (t *Trace) opStarts() ([]int64, int64) {
	s := make([]int64, len(t.Ops))
	var now int64
	for i, op := range t.Ops {
		s[i] = now
		now += op.TimeNs
	}
	return s, now
}
