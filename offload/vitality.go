package offload

// Tensor vitality analysis (G10, section 4.2): when each tensor is alive,
// when it is used, and the inactive periods between its uses, the
// candidates for migration.

// InactivePeriod is a stretch of ops during which a live tensor is not used.
type InactivePeriod struct {
	Tensor int   `json:"tensor"` // tensor id
	Bytes  int64 `json:"bytes"`
	// After is the op whose use ends the previous active time; Before the
	// op that uses it next. -1 for both: a global tensor no op uses.
	After  int `json:"after"`
	Before int `json:"before"`
	// Wraps marks a global tensor's period from its last use to its first
	// use in the next iteration (ops After+1.. then ..Before-1).
	Wraps bool `json:"wraps,omitempty"`
	// Ops are the ops during which the tensor is inactive, in time order.
	Ops []int `json:"ops"`
	// StartNs is when After ends, EndNs when Before starts (in the next
	// iteration, counted from this one's start, for a wrapping period),
	// both from op times with no stalls.
	StartNs int64 `json:"start_ns"`
	EndNs   int64 `json:"end_ns"`
}

// Ns is the period's length in time.
func (p InactivePeriod) Ns() int64 { return p.EndNs - p.StartNs }

// Vitality is the lifetime of one tensor.
type Vitality struct {
	Tensor int    `json:"tensor"` // id
	Bytes  int64  `json:"bytes"`
	Kind   string `json:"kind"`
	// Global tensors (weights, optimizer state, inputs) are alive the whole
	// iteration; intermediate ones from Birth (the op that first writes
	// them) to Death (their last use). Birth and Death are -1 for an
	// intermediate tensor no op uses; 0 and len(ops)-1 for a global one.
	Global  bool             `json:"global"`
	Birth   int              `json:"birth"`
	Death   int              `json:"death"`
	Uses    []int            `json:"uses"` // ops that read or write it, ascending
	Periods []InactivePeriod `json:"periods,omitempty"`
}

// Alive reports whether the tensor occupies memory (somewhere) during op k.
func (v *Vitality) Alive(k int) bool {
	return v.Birth >= 0 && v.Birth <= k && k <= v.Death
}

// Analysis is the vitality of every tensor of a trace.
type Analysis struct {
	Tensors   []Vitality `json:"tensors"` // in trace order
	OpStartNs []int64    `json:"op_start_ns"`
	TotalNs   int64      `json:"total_ns"` // sum of op times
	// Pressure is the bytes alive during each op with nothing migrated.
	Pressure []int64 `json:"pressure"`
	// OpBytes is the bytes each op itself uses (reads and writes).
	OpBytes []int64 `json:"op_bytes"`
	index   map[int]int
}

// Of returns the vitality of tensor id (nil if the trace has none).
func (a *Analysis) Of(id int) *Vitality {
	i, ok := a.index[id]
	if !ok {
		return nil
	}
	return &a.Tensors[i]
}

// Analyze runs the vitality analysis over a valid trace.
func Analyze(t *Trace) *Analysis {
	n := len(t.Ops)
	starts, total := t.opStarts()
	end := func(k int) int64 { return starts[k] + t.Ops[k].TimeNs }
	a := &Analysis{OpStartNs: starts, TotalNs: total, Pressure: make([]int64, n),
		OpBytes: make([]int64, n), index: make(map[int]int, len(t.Tensors))}
	a.Tensors = make([]Vitality, len(t.Tensors))
	for i, x := range t.Tensors {
		a.index[x.ID] = i
		a.Tensors[i] = Vitality{Tensor: x.ID, Bytes: x.Bytes, Kind: x.Kind, Global: GlobalKind(x.Kind), Birth: -1, Death: -1}
	}
	for k, op := range t.Ops {
		seen := map[int]bool{}
		for _, ids := range [][]int{op.Reads, op.Writes} {
			for _, id := range ids {
				if seen[id] {
					continue
				}
				seen[id] = true
				v := &a.Tensors[a.index[id]]
				v.Uses = append(v.Uses, k)
				a.OpBytes[k] += v.Bytes
			}
		}
	}
	for i := range a.Tensors {
		v := &a.Tensors[i]
		u := v.Uses
		if v.Global {
			if n > 0 {
				v.Birth, v.Death = 0, n-1
			}
		} else if len(u) > 0 {
			v.Birth, v.Death = u[0], u[len(u)-1]
		}
		mk := func(after, before int, ops []int, s, e int64, wraps bool) {
			if len(ops) == 0 {
				return
			}
			v.Periods = append(v.Periods, InactivePeriod{Tensor: v.Tensor, Bytes: v.Bytes,
				After: after, Before: before, Wraps: wraps, Ops: ops, StartNs: s, EndNs: e})
		}
		for j := 1; j < len(u); j++ {
			var ops []int
			for k := u[j-1] + 1; k < u[j]; k++ {
				ops = append(ops, k)
			}
			mk(u[j-1], u[j], ops, end(u[j-1]), starts[u[j]], false)
		}
		if v.Global && n > 0 {
			if len(u) == 0 {
				all := make([]int, n)
				for k := range all {
					all[k] = k
				}
				mk(-1, -1, all, 0, total, false)
			} else {
				first, last := u[0], u[len(u)-1]
				var ops []int
				for k := last + 1; k < n; k++ {
					ops = append(ops, k)
				}
				for k := 0; k < first; k++ {
					ops = append(ops, k)
				}
				mk(last, first, ops, end(last), total+starts[first], true)
			}
		}
		if v.Birth >= 0 {
			for k := v.Birth; k <= v.Death; k++ {
				a.Pressure[k] += v.Bytes
			}
		}
	}
	return a
}

// AllPeriods returns every inactive period of the trace.
func (a *Analysis) AllPeriods() []InactivePeriod {
	var out []InactivePeriod
	for _, v := range a.Tensors {
		out = append(out, v.Periods...)
	}
	return out
}
