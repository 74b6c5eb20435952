package offload

import (
	"container/heap"
	"fmt"
	"sort"
	"strings"

	"github.com/pyfastensor/pyfastensor/gds"
)

// ErrInfeasible is wrapped when no plan keeps device memory within
// capacity: a kind of gds.ErrInvalid (the trace and hardware do not go
// together).
var ErrInfeasible = gds.Named(gds.ErrInvalid, "offload: trace does not fit the device")

// Migration is one planned inactive period off the device: pre-evict the
// tensor to Tier after op EvictAfter, prefetch it when op PrefetchAt starts,
// for op Need. A wrapping period (a global tensor) is evicted after its last
// use and prefetched for its first use of the next iteration; PrefetchAt <=
// Need then means the prefetch happens at the start of the iteration.
// EvictAfter, PrefetchAt and Need are -1 for a global tensor no op uses,
// which simply stays in Tier.
type Migration struct {
	Tensor     int    `json:"tensor"`
	Bytes      int64  `json:"bytes"`
	Tier       string `json:"tier"`
	EvictAfter int    `json:"evict_after"`
	PrefetchAt int    `json:"prefetch_at"`
	Need       int    `json:"need"`
	Wraps      bool   `json:"wraps,omitempty"`
	// Sync: no window hides the transfers, the op Need waits for them.
	Sync bool `json:"sync,omitempty"`
}

// MigrationPlan is G10's migration plan for one iteration.
type MigrationPlan struct {
	Migrations []Migration `json:"migrations"`
	Capacity   int64       `json:"capacity"` // device bytes
	// HostCapacity is the host memory the plan runs within (nil: the
	// hardware's). MakePlan sets it to the host memory it planned for.
	HostCapacity *int64 `json:"host_capacity,omitempty"`
	DemandBytes  int64  `json:"demand_bytes"` // peak with nothing migrated
	PeakBytes    int64  `json:"peak_bytes"`   // planned peak, at most Capacity
}

// String prints the plan as a table.
func (p MigrationPlan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "capacity %d bytes, demand %d, planned peak %d, %d migrations\n",
		p.Capacity, p.DemandBytes, p.PeakBytes, len(p.Migrations))
	fmt.Fprintf(&b, "%8s %14s %5s %12s %13s %8s\n", "tensor", "bytes", "tier", "evict_after", "prefetch_at", "need")
	for _, m := range p.Migrations {
		note := ""
		if m.Wraps {
			note += " wraps"
		}
		if m.Sync {
			note += " sync"
		}
		fmt.Fprintf(&b, "%8d %14d %5s %12d %13d %8d%s\n", m.Tensor, m.Bytes, m.Tier, m.EvictAfter, m.PrefetchAt, m.Need, note)
	}
	return b.String()
}

// candidate is an inactive period with its ops' unrolled times.
type candidate struct {
	p  InactivePeriod
	st []float64 // start of each op of p.Ops, unrolled
}

// window returns the positions in c.p.Ops freed by migrating through tier
// with nothing else on its links: [tail, pf), tail being the first op that
// starts after the eviction ends and pf the op at whose start the latest
// safe prefetch is issued (len(Ops): at the start of Before). sync frees
// every op.
func (c *candidate) window(hw Hardware, tier string, sync bool) (tail, pf int) {
	if c.p.After < 0 || sync {
		return 0, len(c.p.Ops)
	}
	return c.windowAt(float64(c.p.StartNs)+hw.evictNs(tier, c.p.Bytes), float64(c.p.EndNs)-hw.fetchNs(tier, c.p.Bytes))
}

// windowAt is window for an eviction that ends at done and a prefetch
// that must be issued by fetchBy; (0, 0) when they leave no op between.
func (c *candidate) windowAt(done, fetchBy float64) (tail, pf int) {
	n := len(c.p.Ops)
	for tail < n && c.st[tail] < done {
		tail++
	}
	pf = -1
	for q := n - 1; q >= 0; q-- {
		if c.st[q] <= fetchBy {
			pf = q
			break
		}
	}
	if pf < tail {
		return 0, 0
	}
	return tail, pf
}

// route is where one period's transfers would go on a tier's links, given
// the traffic planned so far: the window it frees and the link time it
// takes each way.
type route struct {
	tier         string
	tail, pf     int
	evict, fetch []span
	queued       bool // the traffic planned so far delays a transfer
}

// links are the planner's timelines of the four link directions.
type links struct{ ssdW, ssdR, hostW, hostR timeline }

// route plans c's eviction on tier's write link as soon as it has room
// after c's period starts, and its prefetch on the read link as late as
// it can end before the period does. With sync the window is the whole
// period (the op that needs the tensor waits for it).
func (l *links) route(hw Hardware, c *candidate, tier string, sync bool) route {
	r := route{tier: tier, pf: len(c.p.Ops)}
	if c.p.After < 0 {
		return r // a global no op uses: it stays in tier, nothing moves
	}
	w, rd := &l.ssdW, &l.ssdR
	wBps, rBps, lat := hw.SSDWriteBps, hw.SSDReadBps, hw.SSDLatencyNs
	if tier == TierHost {
		w, rd = &l.hostW, &l.hostR
		wBps, rBps, lat = hw.HostLinkBps, hw.HostLinkBps, 0
	}
	dw, dr := linkNs(c.p.Bytes, wBps), linkNs(c.p.Bytes, rBps)
	from, until := c.p.StartNs+lat, c.p.EndNs
	var done, start int64
	r.evict, done = w.forward(from, dw)
	r.fetch, start = rd.backward(until, dr)
	r.queued = done > from+dw || start < until-dr
	if !sync {
		r.tail, r.pf = c.windowAt(float64(done), float64(start-lat))
	}
	return r
}

// take reserves r's link time.
func (l *links) take(r route) {
	if r.tier == TierHost {
		l.hostW.reserve(r.evict)
		l.hostR.reserve(r.fetch)
		return
	}
	l.ssdW.reserve(r.evict)
	l.ssdR.reserve(r.fetch)
}

// makePlan runs G10's smart eviction (Algorithm 1) and smart prefetching
// (section 4.4) over a trace for hw, with the tier tried first: TierSSD
// (G10's order) or TierHost (host memory while it holds the tensor, then
// the SSD; the windows and costs that rank the periods are then the host
// link's). It fails, wrapping ErrInfeasible and naming the capacity, when
// one op alone needs more than the device holds; otherwise the planned
// peak never exceeds hw.DeviceBytes, and with memory to spare the plan is
// empty.
func makePlan(t *Trace, hw Hardware, first string) (MigrationPlan, error) {
	if err := t.Validate(); err != nil {
		return MigrationPlan{}, err
	}
	if err := hw.Validate(); err != nil {
		return MigrationPlan{}, err
	}
	return newPlanInput(t).plan(hw, planVariant{first: first})
}

// planVariant is what a candidate plan varies: the tier tried first, and
// whether a migration's window is the section's own (uncontended
// transfers) or the one its link timelines leave (timed: the traffic
// planned before it counted, so prefetches are issued earlier where a
// link is busy).
// tierEither, as the tier tried first, sends each migration over the
// link (the SSD's or, while host memory holds the tensor, the host's)
// whose planned traffic leaves it the wider window.
const tierEither = "either"

type planVariant struct {
	first string
	timed bool
}

// planInput is what every plan for one trace starts from: its analysis
// and its inactive periods with their ops' unrolled times. Planning only
// reads it, so plans for several hardware can be made from one at once.
type planInput struct {
	t     *Trace
	a     *Analysis
	cands []*candidate
}

func newPlanInput(t *Trace) *planInput {
	a := Analyze(t)
	in := &planInput{t: t, a: a}
	total := float64(a.TotalNs)
	for _, p := range a.AllPeriods() {
		if p.Bytes == 0 {
			continue
		}
		c := &candidate{p: p, st: make([]float64, 0, len(p.Ops))}
		for _, k := range p.Ops {
			s := float64(a.OpStartNs[k])
			if p.Wraps && k < p.Before {
				s += total
			}
			c.st = append(c.st, s)
		}
		in.cands = append(in.cands, c)
	}
	return in
}

// plan is makePlan over a valid trace and hardware.
func (in *planInput) plan(hw Hardware, v planVariant) (MigrationPlan, error) {
	p, _, err := in.planNeed(hw, v)
	return p, err
}

// planNeed is plan, with the least host memory the same plan is made for
// (hw with any host memory from it to hw.HostBytes gives this plan).
func (in *planInput) planNeed(hw Hardware, v planVariant) (MigrationPlan, int64, error) {
	t, a, cands := in.t, in.a, in.cands
	first := v.first // the tier whose timings rank the periods
	if v.first == tierEither {
		first = TierHost
	}
	capB := hw.DeviceBytes
	plan := MigrationPlan{Capacity: capB}
	for k, b := range a.OpBytes {
		if b > capB {
			return plan, 0, fmt.Errorf("%w: op %d (%q) alone needs %d bytes, more than the device capacity of %d bytes",
				ErrInfeasible, k, t.Ops[k].Name, b, capB)
		}
	}
	pressure := append([]int64(nil), a.Pressure...)
	for _, b := range pressure {
		plan.DemandBytes = max(plan.DemandBytes, b)
	}
	if plan.DemandBytes <= capB {
		plan.PeakBytes = plan.DemandBytes
		return plan, 0, nil
	}
	// overW[k]: the sum of (time + 1) over ops before k above capacity
	// with nothing migrated, for bounds on the benefits below.
	n := len(t.Ops)
	overW := make([]float64, n+1)
	for k := range t.Ops {
		overW[k+1] = overW[k]
		if pressure[k] > capB {
			overW[k+1] += float64(t.Ops[k].TimeNs + 1)
		}
	}
	// benefitBound bounds benefit(c, tail, pf) from above: ops of a
	// period are consecutive (modulo n for a wrapping one).
	benefitBound := func(c *candidate, tail, pf int) float64 {
		if tail >= pf {
			return 0
		}
		lo, hi := c.p.Ops[tail], c.p.Ops[pf-1]
		w := overW[hi+1] - overW[lo]
		if hi < lo {
			w = overW[n] - overW[lo] + overW[hi+1]
		}
		return float64(c.p.Bytes) * w * (1 + 1e-9)
	}
	benefit := func(c *candidate, tail, pf int) float64 {
		var b float64
		for q := tail; q < pf; q++ {
			k := c.p.Ops[q]
			over := min(c.p.Bytes, pressure[k]-capB)
			if over > 0 {
				b += float64(over) * float64(t.Ops[k].TimeNs+1)
			}
		}
		return b
	}
	over := func() bool {
		for _, b := range pressure {
			if b > capB {
				return true
			}
		}
		return false
	}
	hostUse := make([]int64, len(t.Ops))
	// hostFaster: moving c out and back over the host link takes less
	// time than over the SSD's (what decides a migration its op waits for).
	hostFaster := func(c *candidate) bool {
		b := c.p.Bytes
		return hw.evictNs(TierHost, b)+hw.fetchNs(TierHost, b) < hw.evictNs(TierSSD, b)+hw.fetchNs(TierSSD, b)
	}
	// holdOnHost plans c's tensor in host memory over its period.
	holdOnHost := func(c *candidate) {
		for _, k := range c.p.Ops {
			hostUse[k] += c.p.Bytes
		}
	}
	// hostNeed: the most host memory a check of fitsHost that passed
	// asked for. With any host memory from hostNeed to hw's, every check
	// comes out the same (one that failed fails with less too), and so
	// does the plan.
	var hostNeed int64
	// fitsHost: host memory holds c's tensor over its period beside what
	// is planned there already.
	fitsHost := func(c *candidate) bool {
		if c.p.After < 0 {
			return false
		}
		var need int64
		for _, k := range c.p.Ops {
			u := hostUse[k] + c.p.Bytes
			if u > hw.HostBytes {
				return false
			}
			need = max(need, u)
		}
		hostNeed = max(hostNeed, need)
		return true
	}
	var lk links
	type chosen struct {
		c         *candidate
		tier      string
		tail, pf  int
		sync      bool
		prefetchT float64
	}
	var picked []chosen
	pickedAt := make([]int, len(cands)) // index in picked + 1; 0: not picked
	// gain is the benefit of migrating candidate i over [tail, pf), or,
	// for a period already migrated over a narrower window, of widening
	// that window to the whole period (a synchronous migration).
	gain := func(i int, sync bool) (float64, int, int) {
		c := cands[i]
		if j := pickedAt[i]; j > 0 {
			m := picked[j-1]
			if !sync || m.sync {
				return 0, 0, 0
			}
			return benefit(c, 0, m.tail) + benefit(c, m.pf, len(c.p.Ops)), 0, len(c.p.Ops)
		}
		tail, pf := c.window(hw, first, sync)
		return benefit(c, tail, pf), tail, pf
	}
	// Lazy greedy: benefits only shrink as pressure falls, so a score
	// computed earlier bounds the score now from above; the top of a heap
	// of such bounds, recomputed and still on top, is the largest score
	// (ties to the lowest index), as a scan of every candidate would find.
	cost := func(i int) float64 {
		b := cands[i].p.Bytes
		return hw.evictNs(first, b) + hw.fetchNs(first, b)
	}
	var heaps [2]scoreHeap // [0]: windows the transfers hide behind; [1]: sync
	for i, c := range cands {
		for si, sync := range []bool{false, true} {
			tail, pf := c.window(hw, first, sync)
			if b := benefitBound(c, tail, pf); b > 0 {
				heaps[si] = append(heaps[si], scored{b / cost(i), i})
			}
		}
	}
	heap.Init(&heaps[0])
	heap.Init(&heaps[1])
	for over() {
		// Pick the period with the largest reduction of pressure above
		// capacity per unit of migration cost (SSD timings, as in the
		// paper); periods whose transfers no window hides come last.
		best, bestSync := -1, false
		for si, sync := range []bool{false, true} {
			h := &heaps[si]
			for h.Len() > 0 {
				top := heap.Pop(h).(scored)
				b, _, _ := gain(top.i, sync)
				if b <= 0 {
					continue
				}
				now := scored{b / cost(top.i), top.i}
				if h.Len() == 0 || !(*h)[0].before(now) {
					best, bestSync = top.i, sync
					break
				}
				heap.Push(h, now)
			}
			if best >= 0 {
				break
			}
		}
		if best < 0 {
			break
		}
		c := cands[best]
		if j := pickedAt[best]; j > 0 {
			m := &picked[j-1]
			for q := 0; q < len(c.p.Ops); q++ {
				if q < m.tail || q >= m.pf {
					pressure[c.p.Ops[q]] -= c.p.Bytes
				}
			}
			m.tail, m.pf, m.sync, m.prefetchT = 0, len(c.p.Ops), true, float64(c.p.EndNs)
			if m.tier == TierSSD && hostFaster(c) && fitsHost(c) {
				// The op now waits for the transfers: the faster link.
				// The SSD time reserved for the narrower window stays
				// reserved (timelines do not release): conservative.
				lk.take(lk.route(hw, c, TierHost, true))
				m.tier = TierHost
				holdOnHost(c)
			}
			continue
		}
		// The SSD first (section 4.3), unless it is saturated: the
		// traffic planned on its links so far would narrow the window
		// this period frees (Algorithm 1, lines 7-17, with the prefetch's
		// reads counted beside the eviction's writes). Then host memory,
		// if it holds the tensor over the period and its links, with
		// their own traffic, free more; a migration whose op waits for
		// it (sync) takes the host link whenever host memory holds the
		// tensor and that link is the faster. The window planned is the
		// section's own (uncontended transfers, latest safe prefetch);
		// the link timelines only choose the tier.
		hostFits := fitsHost(c)
		r := lk.route(hw, c, TierSSD, bestSync)
		if v.first == TierHost && hostFits {
			r = lk.route(hw, c, TierHost, bestSync)
		} else if v.first == tierEither && hostFits {
			// The link whose planned traffic leaves the wider window,
			// host memory on a tie: the two links share the load.
			if h := lk.route(hw, c, TierHost, bestSync); bestSync || benefit(c, h.tail, h.pf) >= benefit(c, r.tail, r.pf) {
				r = h
			}
		} else if hostFits && bestSync && hostFaster(c) {
			r = lk.route(hw, c, TierHost, true) // the op waits for the transfers: the faster link
		} else if hostFits && r.queued {
			h := lk.route(hw, c, TierHost, bestSync)
			if t0, p0 := c.window(hw, TierSSD, false); benefit(c, r.tail, r.pf) < benefit(c, t0, p0) &&
				benefit(c, h.tail, h.pf) > benefit(c, r.tail, r.pf) {
				r = h
			}
		}
		tier := r.tier
		tail, pf := c.window(hw, tier, bestSync)
		if v.timed && !bestSync && r.tail < r.pf {
			tail, pf = r.tail, r.pf
		}
		if !bestSync && benefit(c, tail, pf) <= 0 {
			tail, pf = c.window(hw, tier, true)
			bestSync = true
		}
		lk.take(r)
		for q := tail; q < pf; q++ {
			pressure[c.p.Ops[q]] -= c.p.Bytes
		}
		if tier == TierHost {
			holdOnHost(c)
		}
		pt := float64(c.p.EndNs)
		if pf < len(c.st) {
			pt = c.st[pf]
		}
		picked = append(picked, chosen{c: c, tier: tier, tail: tail, pf: pf, sync: bestSync, prefetchT: pt})
		pickedAt[best] = len(picked)
	}
	if over() {
		// Unreachable when every op fits: evicting every period frees all
		// but each op's own tensors. Kept as a guard.
		return plan, hostNeed, fmt.Errorf("%w: no plan keeps the peak within the device capacity of %d bytes", ErrInfeasible, capB)
	}
	// Eager prefetch: in order of latest safe prefetch time, move each
	// prefetch as early as memory allows; one that reaches the end of its
	// eviction means the tensor can stay, and the migration is dropped.
	sort.SliceStable(picked, func(i, j int) bool { return picked[i].prefetchT < picked[j].prefetchT })
	for _, m := range picked {
		c := m.c
		pf := m.pf
		for pf > m.tail && pressure[c.p.Ops[pf-1]]+c.p.Bytes <= capB {
			pf--
			pressure[c.p.Ops[pf]] += c.p.Bytes
		}
		if pf == m.tail && c.p.After >= 0 && m.tail < m.pf {
			continue // stays on the device the whole period
		}
		mg := Migration{Tensor: c.p.Tensor, Bytes: c.p.Bytes, Tier: m.tier, EvictAfter: c.p.After,
			PrefetchAt: c.p.Before, Need: c.p.Before, Wraps: c.p.Wraps, Sync: m.sync}
		if pf < len(c.p.Ops) {
			mg.PrefetchAt = c.p.Ops[pf]
		}
		plan.Migrations = append(plan.Migrations, mg)
	}
	for _, b := range pressure {
		plan.PeakBytes = max(plan.PeakBytes, b)
	}
	sort.SliceStable(plan.Migrations, func(i, j int) bool { return plan.Migrations[i].EvictAfter < plan.Migrations[j].EvictAfter })
	return plan, hostNeed, nil
}

// FlashNeuronPlan maps FlashNeuron's linear selection (Schedule, phase 1:
// traces carry no compression ratios) onto a trace: the saved tensors are
// the activations in birth order, the budget is the device capacity less
// the peak of everything else, and each offloaded activation goes to the
// SSD over its longest inactive period, written right after its last
// forward use and prefetched one op before it is needed.
func FlashNeuronPlan(t *Trace, hw Hardware) *MigrationPlan {
	a := Analyze(t)
	var acts []*Vitality
	other := append([]int64(nil), a.Pressure...)
	for i := range a.Tensors {
		v := &a.Tensors[i]
		if v.Kind != KindActivation || v.Birth < 0 {
			continue
		}
		acts = append(acts, v)
		for k := v.Birth; k <= v.Death; k++ {
			other[k] -= v.Bytes
		}
	}
	sort.SliceStable(acts, func(i, j int) bool { return acts[i].Birth < acts[j].Birth })
	var otherPeak int64
	for _, b := range other {
		otherPeak = max(otherPeak, b)
	}
	prof := Profile{Budget: max(0, hw.DeviceBytes-otherPeak), Tier: TierSSD}
	for i, v := range acts {
		prof.Tensors = append(prof.Tensors, Tensor{Index: i, Size: v.Bytes,
			WriteNs: int64(hw.evictNs(TierSSD, v.Bytes)), ReadNs: int64(hw.fetchNs(TierSSD, v.Bytes)), BwdGapNs: -1})
	}
	sched := Schedule(prof)
	plan := &MigrationPlan{Capacity: hw.DeviceBytes}
	for _, d := range sched.Decisions {
		v := acts[d.Index]
		if !d.Offload || len(v.Periods) == 0 {
			continue
		}
		long := v.Periods[0]
		for _, p := range v.Periods[1:] {
			if p.Ns() > long.Ns() || p.Ns() == long.Ns() && len(p.Ops) > len(long.Ops) {
				long = p
			}
		}
		plan.Migrations = append(plan.Migrations, Migration{Tensor: v.Tensor, Bytes: v.Bytes, Tier: TierSSD,
			EvictAfter: long.After, PrefetchAt: max(long.After+1, long.Before-1), Need: long.Before})
	}
	return plan
}

// scored is a candidate's score (or a bound on it) in the planner's heaps.
type scored struct {
	score float64
	i     int
}

// before orders scores high first, ties by index.
func (a scored) before(b scored) bool {
	return a.score > b.score || a.score == b.score && a.i < b.i
}

type scoreHeap []scored

func (h scoreHeap) Len() int           { return len(h) }
func (h scoreHeap) Less(i, j int) bool { return h[i].before(h[j]) }
func (h scoreHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *scoreHeap) Push(x any)        { *h = append(*h, x.(scored)) }
func (h *scoreHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
