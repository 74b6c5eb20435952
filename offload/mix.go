package offload

import (
	"container/heap"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/pyfastensor/pyfastensor/gds"
)

// The mix planner behind pyfastensor.offload(policy="auto"): for every
// saved tensor of a profiled training step, keep it, move it to a tier
// (host memory or the SSD, prefetched back), or recompute it in backward
// from tensors that are kept, moved or themselves recomputed, so that the
// predicted step is as short as the saved tensors' resident peak allows.
//
// The step is a sequence of events: the forward packs (a saved tensor
// leaves the forward pass), then the backward nodes that unpack saved
// tensors, each followed by the compute measured after it. A tensor is
// resident from its pack to its last use: kept, for all of it; moved,
// until its write has read it, then again from its prefetch; recomputed,
// from the moment a use needs it (its own first use, or the recompute of
// a tensor that reads it), the recompute's time and its temporaries
// charged there. Links are one channel a direction (device to tier, tier
// to device) serving one transfer at a time.
//
// The decisions are made in one greedy sequence, independent of the
// budget: at the resident peak, the tensor whose change costs the least
// predicted time per byte it frees there is changed (a few of the cheapest
// by estimate are simulated exactly). The sequence's prefixes are the
// frontier; a budget takes the shortest prefix whose peak fits it. So a
// smaller budget takes a longer prefix, never a different one, and its
// peak is no higher: the peak is non-increasing as the budget drops.
//
// Below the frontier's lowest peak, the runtime's backpressure is
// modelled: a pack waits for the writes in flight until the resident
// bytes plus it fit the budget, and a due read waits until it fits. A
// link slower than the forward (moved tensors still being written at the
// peak) then trades step time for memory, down to what no wait frees
// (the kept tensors, one pack, the reads a backward node needs); the
// budget takes the prefix that is fastest so.

// Mix actions.
const (
	MixKeep      = "keep"
	MixRecompute = "recompute"
)

// ErrMixInfeasible is wrapped by the error of a budget below every
// prefix's peak: a kind of gds.ErrInvalid.
var ErrMixInfeasible = gds.Named(gds.ErrInvalid, "offload: budget below any mix")

// MixTensor is one saved tensor of the profiled step.
type MixTensor struct {
	Bytes int64 `json:"bytes"`
	Pack  int   `json:"pack"` // the event of its pack
	Uses  []int `json:"uses"` // the backward events that unpack it, ascending
	// Move: it may go to a tier (false: a kind the store cannot take).
	Move bool `json:"move"`
	// RecomputeNs is the forward time of the ops that make it again from
	// Sources (and parameters); -1: it cannot be recomputed (a random
	// draw, an in-place change, or a value outside the step made it).
	RecomputeNs int64 `json:"recompute_ns"`
	Sources     []int `json:"sources"`    // the tensors (indices) its recompute reads
	TempBytes   int64 `json:"temp_bytes"` // the intermediates alive during its recompute
}

// MixLink is one tier's bandwidths (bytes/s), each way.
type MixLink struct {
	WriteBps float64 `json:"write_bps"`
	ReadBps  float64 `json:"read_bps"`
}

// MixInput is what the planner decides over.
type MixInput struct {
	Tensors   []MixTensor        `json:"tensors"`
	ComputeNs []int64            `json:"compute_ns"` // after each event
	Backward  int                `json:"backward"`   // the first backward event
	HookNs    int64              `json:"hook_ns"`    // each moved tensor's own cost (its hooks' work)
	Tiers     map[string]MixLink `json:"tiers"`      // "host", "ssd": the tiers that may be used
	Budget    int64              `json:"budget"`     // resident peak allowed; 0: none (the whole frontier)
	// Actions, when set, are the plan (one per tensor, as MixDecision's
	// Action): PlanMix simulates them at Budget instead of choosing, and
	// refuses none (a profile calibrated after the plan was made).
	Actions []string `json:"actions,omitempty"`
}

// MixDecision is one tensor's action.
type MixDecision struct {
	Tensor     int    `json:"tensor"`
	Action     string `json:"action"`      // keep, recompute, or a tier's name
	PrefetchAt int    `json:"prefetch_at"` // moved: the event its read is issued at; -1 otherwise
}

// MixPoint is one prefix of the greedy sequence: its length, predicted
// step and resident peak.
type MixPoint struct {
	Changes int   `json:"changes"`
	StepNs  int64 `json:"step_ns"`
	Peak    int64 `json:"peak_bytes"`
}

// MixClass is what one action holds: tensors and bytes.
type MixClass struct {
	Tensors int   `json:"tensors"`
	Bytes   int64 `json:"bytes"`
}

// MixPlan is the planner's answer for a budget.
type MixPlan struct {
	Decisions []MixDecision       `json:"decisions"`
	StepNs    int64               `json:"step_ns"`
	Peak      int64               `json:"peak_bytes"`
	Classes   map[string]MixClass `json:"classes"`
	// WaitNs is how long the forward waits for writes to keep within the
	// budget (in StepNs): a budget below every prefix's peak.
	WaitNs int64 `json:"wait_ns"`
	// MinBudget is the smallest feasible budget: the lowest peak a prefix
	// reaches, the forward waiting for writes.
	MinBudget int64      `json:"min_budget"`
	Frontier  []MixPoint `json:"frontier"`
	Sequence  []MixStep  `json:"sequence"` // the greedy sequence (the frontier's changes)
}

// MixStep is one change of the greedy sequence.
type MixStep struct {
	Tensor int    `json:"tensor"`
	Action string `json:"action"`
}

// Validate rejects input the planner cannot use: events out of range,
// sources that are not earlier tensors, tiers without bandwidth.
func (in *MixInput) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: offload mix: %s", gds.ErrInvalid, fmt.Sprintf(format, args...))
	}
	events := len(in.ComputeNs)
	if in.Backward < 0 || in.Backward > events {
		return bad("backward starts at event %d of %d", in.Backward, events)
	}
	if in.HookNs < 0 || in.Budget < 0 {
		return bad("negative hook time or budget")
	}
	for e, ns := range in.ComputeNs {
		if ns < 0 {
			return bad("event %d: negative compute %d ns", e, ns)
		}
	}
	for name, l := range in.Tiers {
		if !(l.WriteBps > 0) || !(l.ReadBps > 0) || math.IsInf(l.WriteBps, 0) || math.IsInf(l.ReadBps, 0) {
			return bad("tier %q: bandwidths %v, %v", name, l.WriteBps, l.ReadBps)
		}
	}
	if in.Actions != nil && len(in.Actions) != len(in.Tensors) {
		return bad("%d actions for %d tensors", len(in.Actions), len(in.Tensors))
	}
	for i, t := range in.Tensors {
		switch {
		case t.Bytes < 0 || t.TempBytes < 0:
			return bad("tensor %d: negative bytes", i)
		case t.Pack < 0 || t.Pack >= in.Backward:
			return bad("tensor %d: packed at event %d, not in forward (events 0 to %d)", i, t.Pack, in.Backward-1)
		case !slices.IsSorted(t.Uses):
			return bad("tensor %d: uses not ascending", i)
		case t.RecomputeNs < -1:
			return bad("tensor %d: recompute time %d", i, t.RecomputeNs)
		}
		for _, u := range t.Uses {
			if u < in.Backward || u >= events {
				return bad("tensor %d: used at event %d, not in backward (events %d to %d)", i, u, in.Backward, events-1)
			}
		}
		for _, s := range t.Sources {
			if s < 0 || s >= i {
				return bad("tensor %d: source %d is not an earlier tensor", i, s)
			}
		}
	}
	return nil
}

// The simulation works on action codes: keep, recompute, then two per
// tier (in sorted name order): moved and prefetched, moved and read when
// needed; and on event lists made once per input.
const (
	actKeep      = 0
	actRecompute = 1
	actTier      = 2 // the first tier's code
)

// MixOnDemand ends the action of a tensor moved to a tier and read back
// only when needed ("host-on-demand"): no prefetch, whose read would hold
// it beside the tensors still in use, at the cost of waiting for the read.
const MixOnDemand = "-on-demand"

// tierOf returns the tier index of a moved action's code, and whether it
// is read on demand.
func tierOf(code int) (int, bool) { return (code - actTier) / 2, (code-actTier)%2 == 1 }

// mixModel is an input prepared for many simulations: its tiers by code,
// its events' start times and packs, and scratch memory reused by every
// simulation (a model is not safe for concurrent use).
type mixModel struct {
	in     *MixInput
	tiers  []string  // by code - actTier
	links  []MixLink // the same
	start  []int64   // compute before each event (len events+1)
	packAt [][]int   // tensors packed at each event
	first  []int     // each tensor's first use (-1: never used)
	lastU  []int     // each tensor's last use (-1: never used)

	// scratch
	need, last, prefetch        []int
	ready, writeEnd             []int64
	writing, held, materialized []bool
	byPrefetch, byNeed, byLast  eventLists
	order, due                  []int
	ends                        writeHeap
	linkFree, readFree          []int64
}

// eventLists are lists of tensors per event, in one flat array.
type eventLists struct {
	at    []int // start of each event's list in items (len events+1)
	items []int
}

func (l *eventLists) build(events int, key []int) {
	l.at = slices.Grow(l.at[:0], events+1)[:events+1]
	clear(l.at)
	for _, e := range key {
		if e >= 0 {
			l.at[e+1]++
		}
	}
	for e := 0; e < events; e++ {
		l.at[e+1] += l.at[e]
	}
	l.items = slices.Grow(l.items[:0], l.at[events])[:l.at[events]]
	fill := slices.Clone(l.at[:events])
	for i, e := range key {
		if e >= 0 {
			l.items[fill[e]] = i
			fill[e]++
		}
	}
}

func (l *eventLists) of(e int) []int { return l.items[l.at[e]:l.at[e+1]] }

func newMixModel(in *MixInput) *mixModel {
	n, events := len(in.Tensors), len(in.ComputeNs)
	m := &mixModel{in: in, start: make([]int64, events+1), packAt: make([][]int, events),
		first: make([]int, n), lastU: make([]int, n)}
	for name := range in.Tiers {
		m.tiers = append(m.tiers, name)
	}
	sort.Strings(m.tiers)
	for _, name := range m.tiers {
		m.links = append(m.links, in.Tiers[name])
	}
	for e, ns := range in.ComputeNs {
		m.start[e+1] = m.start[e] + ns
	}
	for i, t := range in.Tensors {
		m.packAt[t.Pack] = append(m.packAt[t.Pack], i)
		m.first[i], m.lastU[i] = -1, -1
		if len(t.Uses) > 0 {
			m.first[i], m.lastU[i] = t.Uses[0], t.Uses[len(t.Uses)-1]
		}
	}
	m.need, m.last, m.prefetch = make([]int, n), make([]int, n), make([]int, n)
	m.ready, m.writeEnd = make([]int64, n), make([]int64, n)
	m.writing, m.held, m.materialized = make([]bool, n), make([]bool, n), make([]bool, n)
	m.linkFree, m.readFree = make([]int64, len(m.tiers)), make([]int64, len(m.tiers))
	return m
}

// actionName is code's name: keep, recompute, or the tier's.
func (m *mixModel) actionName(code int) string {
	switch code {
	case actKeep:
		return MixKeep
	case actRecompute:
		return MixRecompute
	}
	k, demand := tierOf(code)
	if demand {
		return m.tiers[k] + MixOnDemand
	}
	return m.tiers[k]
}

// mixSim is a simulation's result.
type mixSim struct {
	stepNs    int64
	peak      int64
	peakEvent int
	waitNs    int64 // the forward's waits for writes (hold > 0)
}

// plan fills need, last and prefetch for actions: each tensor's first need
// (its first use, or the need of a recomputed tensor that reads it, if
// earlier), its last use (extended to the recomputes that read it: a
// recompute holds its sources until it has run, and a kept source until
// the recomputed tensor's own last use, as the recipe bound to it holds
// it), and each moved tensor's
// prefetch event: the latest from which the compute before its need
// covers its read, in need order (budget-independent, so the greedy's
// sequence is).
func (m *mixModel) plan(actions []int) {
	in := m.in
	copy(m.need, m.first)
	copy(m.last, m.lastU)
	for i := len(in.Tensors) - 1; i >= 0; i-- { // consumers come after their sources
		if actions[i] != actRecompute || m.need[i] < 0 {
			continue
		}
		for _, s := range in.Tensors[i].Sources {
			if m.need[s] < 0 || m.need[i] < m.need[s] {
				m.need[s] = m.need[i]
			}
			if actions[s] == actKeep {
				m.last[s] = max(m.last[s], m.last[i])
			} else {
				m.last[s] = max(m.last[s], m.need[i])
			}
		}
	}
	m.order = m.order[:0]
	for i, a := range actions {
		m.prefetch[i] = -1
		if _, demand := tierOf(a); a >= actTier && !demand && m.need[i] >= 0 {
			m.order = append(m.order, i)
		}
	}
	slices.SortStableFunc(m.order, func(a, b int) int { return m.need[a] - m.need[b] })
	for _, i := range m.order {
		k, _ := tierOf(actions[i])
		read := linkNs(in.Tensors[i].Bytes, m.links[k].ReadBps)
		e := m.need[i]
		for e > in.Backward && m.start[m.need[i]]-m.start[e] < read {
			e--
		}
		m.prefetch[i] = e
	}
}

// simulate runs the step under actions and returns its time and resident
// peak (see the file's comment for the model). hold > 0 is the runtime's
// backpressure at that budget: a pack that would take the resident bytes
// past hold first waits for the writes in flight, oldest first, until it
// fits or none is left (the forward trades time for memory when the link
// cannot carry the moved tensors away as fast as the forward makes them),
// and a due read waits, in order, while the resident bytes plus it would
// exceed hold (a read not issued by its need is issued there).
func (m *mixModel) simulate(actions []int, hold int64) mixSim {
	in := m.in
	events := len(in.ComputeNs)
	m.plan(actions)
	m.byPrefetch.build(events, m.prefetch)
	m.byNeed.build(events, m.need)
	m.byLast.build(events, m.last)
	clear(m.writing)
	clear(m.held)
	clear(m.materialized)
	clear(m.linkFree)
	clear(m.readFree)
	m.ends, m.due = m.ends[:0], m.due[:0]
	next := 0 // the first of m.due not yet issued (hold > 0)
	for i := range m.ready {
		m.ready[i] = -1
	}
	t, resident, waited := int64(0), int64(0), int64(0)
	peak, peakEvent := int64(-1), 0
	sample := func(e int, extra int64) {
		if resident+extra > peak {
			peak, peakEvent = resident+extra, e
		}
	}
	// read issues tensor i's read: after its own write (whose source memory
	// is then free) and the reads before it on the link.
	read := func(i int) {
		k, _ := tierOf(actions[i])
		s := max(t, m.readFree[k], m.writeEnd[i])
		if m.writing[i] {
			m.writing[i] = false
			resident -= in.Tensors[i].Bytes
		}
		m.ready[i] = s + linkNs(in.Tensors[i].Bytes, m.links[k].ReadBps)
		m.readFree[k] = m.ready[i]
		resident += in.Tensors[i].Bytes
		m.held[i] = true
	}
	var materialize func(i, e int)
	materialize = func(i, e int) {
		if m.materialized[i] {
			return
		}
		m.materialized[i] = true
		switch actions[i] {
		case actKeep:
		case actRecompute:
			tn := &in.Tensors[i]
			for _, s := range tn.Sources {
				materialize(s, e)
			}
			sample(e, tn.TempBytes+tn.Bytes)
			t += tn.RecomputeNs
			resident += tn.Bytes
			m.held[i] = true
		default: // moved: wait for its read, issuing it now if it was not
			if m.ready[i] < 0 {
				read(i)
			}
			t = max(t, m.ready[i])
		}
	}
	hooks := int64(0)
	for _, a := range actions {
		if a >= actTier {
			hooks += in.HookNs
		}
	}
	land := func() { // the write that ends first lets its tensor go
		w := heap.Pop(&m.ends).(writeDone)
		if m.writing[w.i] {
			m.writing[w.i] = false
			resident -= in.Tensors[w.i].Bytes
		}
	}
	for e := 0; e < events; e++ {
		for len(m.ends) > 0 && m.ends[0].end <= t {
			land()
		}
		for _, i := range m.packAt[e] {
			tn := &in.Tensors[i]
			for hold > 0 && len(m.ends) > 0 && resident+tn.Bytes > hold { // every pack, whatever its action, as the runtime's
				if end := m.ends[0].end; end > t {
					waited += end - t
					t = end
				}
				land()
			}
			switch a := actions[i]; a {
			case actKeep:
				resident += tn.Bytes
				m.held[i] = true
				m.materialized[i] = true
			case actRecompute:
			default:
				k, _ := tierOf(a)
				s := max(t, m.linkFree[k])
				m.writeEnd[i] = s + linkNs(tn.Bytes, m.links[k].WriteBps)
				m.linkFree[k] = m.writeEnd[i]
				resident += tn.Bytes
				m.writing[i] = true
				heap.Push(&m.ends, writeDone{i, m.writeEnd[i]})
			}
		}
		if hold > 0 { // due reads go in order while they fit, as the runtime's planned prefetcher issues them
			n := len(m.due)
			m.due = append(m.due, m.byPrefetch.of(e)...)
			slices.SortStableFunc(m.due[n:], func(a, b int) int { return m.need[a] - m.need[b] }) // the first needed first
			for ; next < len(m.due); next++ {
				i := m.due[next]
				if m.ready[i] >= 0 {
					continue
				}
				if b := in.Tensors[i].Bytes; resident > 0 && !m.writing[i] && resident+b > hold {
					break
				}
				read(i)
			}
		} else {
			for _, i := range m.byPrefetch.of(e) {
				if m.ready[i] < 0 {
					read(i)
				}
			}
		}
		for _, i := range m.byNeed.of(e) {
			materialize(i, e)
		}
		sample(e, 0)
		t += in.ComputeNs[e]
		for _, i := range m.byLast.of(e) {
			if m.held[i] {
				resident -= in.Tensors[i].Bytes
				m.held[i] = false
			}
		}
	}
	return mixSim{stepNs: t + hooks, peak: max(peak, 0), peakEvent: peakEvent, waitNs: waited}
}

// aliveAt reports whether tensor i, under action a, holds memory at event
// e, as the greedy sees it (m.plan of the same actions run last).
func (m *mixModel) aliveAt(i, a, e int) bool {
	t := m.in.Tensors[i]
	if m.last[i] < 0 {
		return a == actKeep && e >= t.Pack && e < m.in.Backward
	}
	if a == actKeep {
		return e >= t.Pack && e <= m.last[i]
	}
	return e >= m.need[i] && e <= m.last[i]
}

// writeDone is a write in flight: its tensor and when it ends.
type writeDone struct {
	i   int
	end int64
}

// writeHeap orders writes in flight by their end.
type writeHeap []writeDone

func (h writeHeap) Len() int           { return len(h) }
func (h writeHeap) Less(a, b int) bool { return h[a].end < h[b].end }
func (h writeHeap) Swap(a, b int)      { h[a], h[b] = h[b], h[a] }
func (h *writeHeap) Push(x any)        { *h = append(*h, x.(writeDone)) }
func (h *writeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// mixOption is a change the greedy may make.
type mixOption struct {
	tensor, action int
	cost           float64 // estimated ns per byte
}

// options lists the changes of the kept tensors alive at the peak (where
// none is left, of every kept tensor: the sequence goes on to what only
// the waits' budgets use), with an estimate of what each costs per byte
// it frees: a move, what its write and read take beyond the compute
// between its pack and its use; a recompute, its time.
func (m *mixModel) options(actions []int, sim mixSim, out []mixOption) []mixOption {
	out = m.optionsAt(actions, sim.peakEvent, out)
	if len(out) == 0 { // none at the peak: the kept tensors elsewhere, for the budgets met by waiting
		out = m.optionsAt(actions, -1, out)
	}
	return out
}

// optionsAt lists the changes of the kept tensors alive at event e (-1:
// anywhere).
func (m *mixModel) optionsAt(actions []int, e int, out []mixOption) []mixOption {
	in := m.in
	m.plan(actions)
	out = out[:0]
	for i, t := range in.Tensors {
		if actions[i] != actKeep || t.Bytes == 0 || (e >= 0 && !m.aliveAt(i, actKeep, e)) {
			continue
		}
		b := float64(t.Bytes)
		need := in.Backward
		if m.first[i] >= 0 {
			need = m.first[i]
		}
		if t.Move {
			window := float64(m.start[need] - m.start[t.Pack+1])
			for k, l := range m.links {
				w, r := float64(linkNs(t.Bytes, l.WriteBps)), float64(linkNs(t.Bytes, l.ReadBps))
				hook := float64(in.HookNs)
				out = append(out, mixOption{i, actTier + 2*k, (math.Max(0, w+r-window) + hook) / b},
					mixOption{i, actTier + 2*k + 1, (math.Max(0, w-window) + r + hook) / b})
			}
		}
		if t.RecomputeNs >= 0 {
			out = append(out, mixOption{i, actRecompute, float64(t.RecomputeNs) / b})
		}
	}
	return out
}

// mixCandidates is how many of the cheapest options by estimate are
// simulated exactly at each change of the greedy.
const mixCandidates = 6

// sequence runs the greedy to the end: every prefix's point, and the
// changes in order (tensor, action code).
func (m *mixModel) sequence() ([]MixPoint, [][2]int) {
	actions := make([]int, len(m.in.Tensors))
	sim := m.simulate(actions, 0)
	points := []MixPoint{{0, sim.stepNs, sim.peak}}
	var steps [][2]int
	var opts []mixOption
	for {
		opts = m.options(actions, sim, opts)
		if len(opts) == 0 {
			break
		}
		sort.SliceStable(opts, func(a, b int) bool {
			if opts[a].cost != opts[b].cost {
				return opts[a].cost < opts[b].cost
			}
			return opts[a].tensor < opts[b].tensor
		})
		// Time per byte of peak it removes; a change that removes none comes after every change
		// that does (by its time per byte of the tensor: it may let a later change lower the peak).
		best, bestLowers, bestScore := -1, false, math.Inf(1)
		var bestSim mixSim
		for k := 0; k < len(opts) && k < mixCandidates; k++ {
			o := opts[k]
			actions[o.tensor] = o.action
			s := m.simulate(actions, 0)
			actions[o.tensor] = actKeep
			lowers := s.peak < sim.peak
			freed := float64(m.in.Tensors[o.tensor].Bytes)
			if lowers {
				freed = float64(sim.peak - s.peak)
			}
			score := float64(s.stepNs-sim.stepNs) / freed
			if (lowers && !bestLowers) || (lowers == bestLowers && score < bestScore) {
				best, bestLowers, bestScore, bestSim = k, lowers, score, s
			}
		}
		o := opts[best]
		actions[o.tensor] = o.action
		sim = bestSim
		steps = append(steps, [2]int{o.tensor, o.action})
		points = append(points, MixPoint{len(steps), sim.stepNs, sim.peak})
	}
	return points, steps
}

// PlanMix decides every saved tensor's action for in.Budget (0: no
// budget, every tensor kept) and returns the plan with the whole
// frontier. A budget that a prefix's peak fits takes the shortest such
// prefix. Below every prefix's peak, the forward waits for writes (the
// runtime's backpressure): the budget takes the prefix that is fastest
// with those waits among the ones that fit it. A budget below that too
// gives an error wrapping ErrMixInfeasible that names the smallest
// feasible budget.
func PlanMix(in *MixInput) (MixPlan, error) {
	if err := in.Validate(); err != nil {
		return MixPlan{}, err
	}
	m := newMixModel(in)
	points, codes := m.sequence()
	steps := make([]MixStep, len(codes))
	for k, c := range codes {
		steps[k] = MixStep{Tensor: c[0], Action: m.actionName(c[1])}
	}
	prefix := func(k int) []int {
		actions := make([]int, len(in.Tensors))
		for _, c := range codes[:k] {
			actions[c[0]] = c[1]
		}
		return actions
	}
	lowest := 0 // the prefix of the lowest peak without waits
	for k, p := range points {
		if p.Peak < points[lowest].Peak {
			lowest = k
		}
	}
	minBudget := m.leastHold(prefix(lowest), points[lowest].Peak)
	if last := len(points) - 1; last != lowest {
		minBudget = min(minBudget, m.leastHold(prefix(last), points[last].Peak))
	}
	k, hold := 0, int64(0)
	var given []int
	if in.Actions != nil {
		var err error
		if given, err = m.codes(in.Actions); err != nil {
			return MixPlan{}, err
		}
	} else if in.Budget > 0 {
		k = -1
		for _, p := range points {
			if p.Peak <= in.Budget {
				k = p.Changes
				break
			}
		}
		if k < 0 && in.Budget >= minBudget {
			k, hold = m.fastestHeld(points, prefix, in.Budget)
		}
		if k < 0 {
			return MixPlan{MinBudget: minBudget, Frontier: points, Sequence: steps}, fmt.Errorf(
				"%w: a budget of %d bytes is below what any mix of keeping, moving and recomputing the saved "+
					"tensors reaches: the smallest feasible budget is %d bytes (%.1f MiB)",
				ErrMixInfeasible, in.Budget, minBudget, float64(minBudget)/(1<<20))
		}
	}
	if hold == 0 {
		hold = in.Budget // what the runtime waits at (no wait where the peak without waits fits)
	}
	actions := given
	if actions == nil {
		actions = prefix(k)
	}
	sim := m.simulate(actions, hold)
	plan := MixPlan{StepNs: sim.stepNs, Peak: sim.peak, WaitNs: sim.waitNs, MinBudget: minBudget, Frontier: points,
		Sequence: steps, Classes: map[string]MixClass{}}
	for i, a := range actions {
		name := m.actionName(a)
		plan.Decisions = append(plan.Decisions, MixDecision{Tensor: i, Action: name, PrefetchAt: m.prefetch[i]})
		c := plan.Classes[name]
		c.Tensors++
		c.Bytes += in.Tensors[i].Bytes
		plan.Classes[name] = c
	}
	return plan, nil
}

// codes are the action codes of names (MixDecision's Action).
func (m *mixModel) codes(names []string) ([]int, error) {
	byName := map[string]int{}
	for code := actKeep; code < actTier+2*len(m.tiers); code++ {
		byName[m.actionName(code)] = code
	}
	out := make([]int, len(names))
	for i, name := range names {
		code, ok := byName[name]
		t := m.in.Tensors[i]
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: offload mix: tensor %d: action %q is not keep, recompute or a tier's",
				gds.ErrInvalid, i, name)
		case code == actRecompute && t.RecomputeNs < 0, code >= actTier && !t.Move:
			return nil, fmt.Errorf("%w: offload mix: tensor %d cannot be %s", gds.ErrInvalid, i, name)
		}
		out[i] = code
	}
	return out, nil
}

// leastHold is the smallest budget actions fit when the forward waits for
// writes to keep within it (at most peak, their peak without waits): a
// binary search, the waits' peak falling as the budget does until what
// no wait frees (kept tensors, one pack, the reads) exceeds it.
func (m *mixModel) leastHold(actions []int, peak int64) int64 {
	lo, hi := int64(0), peak // hi fits (no wait is needed at the peak without waits)
	for lo+1 < hi {
		mid := lo + (hi-lo)/2
		if m.simulate(actions, mid).peak <= mid {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// fastestHeld is the prefix (and the budget its writes are waited for at)
// that is fastest among those whose peak with waits fits budget; -1 if
// none does. Waiting at the budget is what the runtime does; where no
// prefix fits so (the waits' peak is not monotone in the budget), the
// least budget the lowest prefixes fit is waited for.
func (m *mixModel) fastestHeld(points []MixPoint, prefix func(int) []int, budget int64) (int, int64) {
	best, bestNs := -1, int64(math.MaxInt64)
	for k := range points {
		if s := m.simulate(prefix(k), budget); s.peak <= budget && s.stepNs < bestNs {
			best, bestNs = k, s.stepNs
		}
	}
	if best >= 0 {
		return best, budget
	}
	for k := len(points) - 1; k >= 0; k-- {
		actions := prefix(k)
		if h := m.leastHold(actions, points[k].Peak); h <= budget {
			return k, h
		}
	}
	return -1, 0
}
