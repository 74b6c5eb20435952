package offload

import (
	"fmt"
	"math"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Result is what a simulated iteration cost.
type Result struct {
	Policy          string `json:"policy"`
	TimeNs          int64  `json:"time_ns"`  // when the last op ends
	IdealNs         int64  `json:"ideal_ns"` // sum of op times
	StallNs         int64  `json:"stall_ns"` // time ops waited for memory or data
	PeakDeviceBytes int64  `json:"peak_device_bytes"`
	Feasible        bool   `json:"feasible"`
	Error           string `json:"error,omitempty"` // why it is not feasible
	SSDWriteBytes   int64  `json:"ssd_write_bytes"`
	SSDReadBytes    int64  `json:"ssd_read_bytes"`
	HostWriteBytes  int64  `json:"host_write_bytes"`
	HostReadBytes   int64  `json:"host_read_bytes"`
	// OpStallNs is how long each op waited before it could start;
	// OpSlowdown is (time + stall) / time (time read as 1 ns when 0).
	OpStallNs  []int64   `json:"op_stall_ns"`
	OpSlowdown []float64 `json:"op_slowdown"`
}

// Policies SimulatePolicy knows.
const (
	PolicyIdeal       = "ideal"
	PolicyOnDemand    = "on_demand"
	PolicyFlashNeuron = "flashneuron"
	PolicyG10         = "g10"
)

// Policies lists the policies SimulatePolicy knows, in the order a
// comparison shows them.
var Policies = []string{PolicyIdeal, PolicyOnDemand, PolicyFlashNeuron, PolicyG10}

// SimulatePolicy replays a trace under one of the named policies:
// "ideal" (unlimited device memory), "on_demand" (evict the least recently
// used tensor and read tensors back when an op needs them, synchronously),
// "flashneuron" (FlashNeuron's linear selection over the activations, see
// FlashNeuronPlan) and "g10" (MakePlan). A plan that cannot be made gives a
// result with Feasible false and the reason in Error.
func SimulatePolicy(t *Trace, hw Hardware, policy string) (Result, error) {
	if err := t.Validate(); err != nil {
		return Result{}, err
	}
	if err := hw.Validate(); err != nil {
		return Result{}, err
	}
	var r Result
	switch policy {
	case PolicyIdeal:
		hw.DeviceBytes = math.MaxInt64
		r = Simulate(t, hw, nil)
	case PolicyOnDemand:
		r = Simulate(t, hw, nil)
	case PolicyFlashNeuron:
		r = Simulate(t, hw, FlashNeuronPlan(t, hw))
	case PolicyG10:
		_, res, err := bestPlan(t, hw)
		if err != nil {
			a := Analyze(t)
			r = Result{IdealNs: a.TotalNs, Error: err.Error()}
		} else {
			r = res
		}
	default:
		return Result{}, fmt.Errorf("%w: unknown policy %q (want ideal, on_demand, flashneuron or g10)", gds.ErrInvalid, policy)
	}
	r.Policy = policy
	return r, nil
}

type tstate int

const (
	sAbsent tstate = iota // not born yet, or dead
	sDevice
	sTier
	sEvicting
	sFetching
)

// Links: each direction of each path is a channel of its own.
const (
	linkSSDWrite = iota
	linkSSDRead
	linkHostWrite
	linkHostRead
	nLinks
)

type simTensor struct {
	bytes   int64
	state   tstate
	tier    string
	lastUse int
	queued  bool // a planned prefetch waits for device memory
}

type xfer struct {
	t     int
	link  int
	lat   float64 // latency left, ns
	rem   float64 // bytes left
	evict bool
	need  int // a fetch: the op that next uses the tensor (n + op for the next iteration)
}

type sim struct {
	hw       Hardware
	ts       []simTensor
	now      float64
	used     int64
	hostUsed int64
	hostNeed int64 // the most host memory a tensor placed there needed (see simulateNeed)
	peak     int64
	xs       []*xfer
	queue    []int
	urgent   map[int]bool // the tensors the running op waits for
	placing  bool         // the op about to run is taking its memory: no planned prefetch starts
	a        *Analysis
	n, k     int // ops in the trace, the op under way
	r        *Result
}

func (s *sim) bps(link int) float64 {
	switch link {
	case linkSSDWrite:
		return s.hw.SSDWriteBps / 1e9
	case linkSSDRead:
		return s.hw.SSDReadBps / 1e9
	}
	return s.hw.HostLinkBps / 1e9
}

func (s *sim) alloc(b int64) {
	s.used += b
	if s.used > s.peak {
		s.peak = s.used
	}
}

// step moves time to the next transfer event or to limit, whichever is
// first. It reports whether anything completed.
func (s *sim) step(limit float64) bool {
	// Each link serves one transfer at a time at its full bandwidth, of
	// those past their latency: on a read link the one whose tensor is
	// needed first (the first issued of those), on a write link the first
	// issued among those of the tensors the running op waits for, else
	// among all. (G10's simulator likewise takes pages from first-in
	// first-out queues, faults first.)
	var head [nLinks]*xfer
	for _, x := range s.xs {
		if x.lat > 0 {
			continue
		}
		if h := head[x.link]; h == nil || x.evict && s.urgent[x.t] && !s.urgent[h.t] || !x.evict && x.need < h.need {
			head[x.link] = x
		}
	}
	dt := limit - s.now
	for _, x := range s.xs {
		d := x.lat
		if d <= 0 {
			if head[x.link] != x {
				continue
			}
			d = x.rem / s.bps(x.link)
		}
		if d < dt {
			dt = d
		}
	}
	if dt < 0 {
		dt = 0
	}
	if dt == limit-s.now {
		s.now = limit // exactly: at 1e11 ns, now + (limit - now) may round short of limit
	} else {
		s.now += dt
	}
	done := false
	keep := s.xs[:0]
	for _, x := range s.xs {
		if x.lat > 0 {
			x.lat -= dt
			if x.lat < 1e-9 {
				x.lat = 0
			}
		} else if head[x.link] == x {
			x.rem -= dt * s.bps(x.link)
		}
		if x.lat <= 0 && x.rem <= 1e-6*math.Max(1, float64(s.ts[x.t].bytes)) {
			s.finish(x)
			done = true
			continue
		}
		keep = append(keep, x)
	}
	s.xs = keep
	if done {
		s.tryQueued()
	}
	return done
}

func (s *sim) finish(x *xfer) {
	t := &s.ts[x.t]
	if x.evict {
		s.used -= t.bytes
		t.state = sTier
		return
	}
	t.state = sDevice
	if t.tier == TierHost {
		s.hostUsed -= t.bytes
	}
	t.tier = ""
}

func (s *sim) busy() bool { return len(s.xs) > 0 }

// evict starts writing tensor i out; the host takes it when it has room.
func (s *sim) evict(i int, tier string) {
	t := &s.ts[i]
	if tier == TierHost && s.hostUsed+t.bytes > s.hw.HostBytes {
		tier = TierSSD
	}
	t.state, t.tier = sEvicting, tier
	x := &xfer{t: i, rem: float64(t.bytes), evict: true}
	if tier == TierHost {
		s.hostUsed += t.bytes
		s.hostNeed = max(s.hostNeed, s.hostUsed)
		x.link = linkHostWrite
		s.r.HostWriteBytes += t.bytes
	} else {
		x.link, x.lat = linkSSDWrite, float64(s.hw.SSDLatencyNs)
		s.r.SSDWriteBytes += t.bytes
	}
	s.xs = append(s.xs, x)
}

// fetch starts reading tensor i back; the caller has checked the room.
func (s *sim) fetch(i int) {
	t := &s.ts[i]
	s.alloc(t.bytes)
	t.state, t.queued = sFetching, false
	x := &xfer{t: i, rem: float64(t.bytes), need: 2 * s.n}
	if uses := s.a.Tensors[i].Uses; len(uses) > 0 {
		x.need = s.n + uses[0]
		if u := nextUseAtOrAfter(uses, s.k); u >= 0 {
			x.need = u
		}
	}
	if t.tier == TierHost {
		x.link = linkHostRead
		s.r.HostReadBytes += t.bytes
	} else {
		x.link, x.lat = linkSSDRead, float64(s.hw.SSDLatencyNs)
		s.r.SSDReadBytes += t.bytes
	}
	s.xs = append(s.xs, x)
}

// tryQueued starts the planned prefetches that now fit, in plan order;
// none while the next op takes its memory (memory an eviction frees then
// is the op's first, so a prefetch a faster link lets start cannot push
// the op into evicting on demand).
func (s *sim) tryQueued() {
	if s.placing {
		return
	}
	keep := s.queue[:0]
	for _, i := range s.queue {
		t := &s.ts[i]
		if !t.queued {
			continue
		}
		if t.state == sTier && s.used+t.bytes <= s.hw.DeviceBytes {
			s.fetch(i)
			continue
		}
		keep = append(keep, i)
	}
	s.queue = keep
}

// makeRoom frees device memory until need bytes fit, evicting the least
// recently used resident tensors outside keep (to the host while it has
// room, then to the SSD) and waiting for the writes. It fails when nothing
// more can be freed.
func (s *sim) makeRoom(need int64, keep map[int]bool) bool {
	for s.hw.DeviceBytes-s.used < need {
		evicting := false
		for _, x := range s.xs {
			if x.evict || !keep[x.t] {
				evicting = true
			}
		}
		if evicting {
			s.step(math.Inf(1))
			continue
		}
		victim := -1
		for i := range s.ts {
			t := &s.ts[i]
			if t.state == sDevice && !keep[i] && (victim < 0 || t.lastUse < s.ts[victim].lastUse) {
				victim = i
			}
		}
		if victim < 0 {
			return false
		}
		s.evict(victim, TierHost)
	}
	return true
}

// Simulate replays a valid trace on hw under plan (nil: no plan, the
// on-demand policy alone). Planned prefetches that do not fit in device
// memory wait, and none starts while an op takes its memory; an op whose
// tensors do not fit evicts on demand, so device
// memory never exceeds hw.DeviceBytes, nor the plan's Capacity where that
// is less, and host memory hw.HostBytes, nor the plan's HostCapacity (a
// plan runs within the memory it was made for, so a plan for less memory
// takes the same time on more). Each link direction serves
// one transfer at a time at its full bandwidth, of those past their
// latency: a read link the one whose tensor is needed soonest, a write
// link the first issued (those of the tensors the running op waits for
// first). Time is when the last op ends (the last evictions overlap the
// next iteration).
func Simulate(t *Trace, hw Hardware, plan *MigrationPlan) Result {
	return simulate(Analyze(t), t, hw, plan)
}

// simulate is Simulate with the trace's analysis, which it only reads.
func simulate(a *Analysis, t *Trace, hw Hardware, plan *MigrationPlan) Result {
	r, _ := simulateNeed(a, t, hw, plan)
	return r
}

// simulateNeed is simulate, with the least host memory the replay is the
// same with: every tensor placed in host memory found room there with that
// much, and one that did not finds none with less either.
func simulateNeed(a *Analysis, t *Trace, hw Hardware, plan *MigrationPlan) (Result, int64) {
	if plan != nil && plan.Capacity > 0 && plan.Capacity < hw.DeviceBytes {
		hw.DeviceBytes = plan.Capacity
	}
	if plan != nil && plan.HostCapacity != nil && *plan.HostCapacity < hw.HostBytes {
		hw.HostBytes = max(0, *plan.HostCapacity)
	}
	n := len(t.Ops)
	r := Result{IdealNs: a.TotalNs, Feasible: true, OpStallNs: make([]int64, n), OpSlowdown: make([]float64, n)}
	s := &sim{hw: hw, ts: make([]simTensor, len(a.Tensors)), r: &r, a: a, n: n}
	evictAfter := make([][]Migration, n)
	fetchAt := make([][]int, n)
	startTier := map[int]string{}
	if plan != nil {
		for _, m := range plan.Migrations {
			i, ok := a.index[m.Tensor]
			if !ok {
				continue
			}
			if m.EvictAfter >= 0 && m.EvictAfter < n {
				evictAfter[m.EvictAfter] = append(evictAfter[m.EvictAfter], m)
			}
			if m.PrefetchAt >= 0 && m.PrefetchAt < n {
				fetchAt[m.PrefetchAt] = append(fetchAt[m.PrefetchAt], i)
			}
			if m.EvictAfter < 0 || (m.Wraps && m.PrefetchAt <= m.Need) {
				startTier[i] = m.Tier
			}
		}
	}
	// Global tensors start on the device unless the plan keeps them out,
	// or they do not fit (then they start where the last iteration left
	// them: host while it has room, then SSD).
	for i, v := range a.Tensors {
		s.ts[i] = simTensor{bytes: v.Bytes, lastUse: -1}
		if !v.Global {
			continue
		}
		tier, out := startTier[i]
		if !out && s.used+v.Bytes <= hw.DeviceBytes {
			s.ts[i].state = sDevice
			s.alloc(v.Bytes)
			continue
		}
		if !out || tier == TierHost && s.hostUsed+v.Bytes > hw.HostBytes {
			tier = TierHost
			if s.hostUsed+v.Bytes > hw.HostBytes {
				tier = TierSSD
			}
		}
		s.ts[i].state, s.ts[i].tier = sTier, tier
		if tier == TierHost {
			s.hostUsed += v.Bytes
			s.hostNeed = max(s.hostNeed, s.hostUsed)
		}
	}
	fail := func(k int, why string) Result {
		r.Feasible = false
		r.Error = fmt.Sprintf("op %d (%q): %s", k, t.Ops[k].Name, why)
		r.TimeNs = roundNs(s.now)
		r.PeakDeviceBytes = s.peak
		return r
	}
	for k, op := range t.Ops {
		s.k = k
		if a.OpBytes[k] > hw.DeviceBytes {
			return fail(k, fmt.Sprintf("needs %d bytes at once, more than the device capacity of %d bytes", a.OpBytes[k], hw.DeviceBytes)), s.hostNeed
		}
		ready := s.now
		for _, i := range fetchAt[k] {
			if !s.ts[i].queued && (s.ts[i].state == sTier || s.ts[i].state == sEvicting) {
				s.ts[i].queued = true
				s.queue = append(s.queue, i)
			}
		}
		set := map[int]bool{}
		for _, ids := range [][]int{op.Reads, op.Writes} {
			for _, id := range ids {
				set[a.index[id]] = true
			}
		}
		s.urgent = set
		s.placing = true
		// Wait for writes of the op's own tensors still under way.
		for {
			waiting := false
			for i := range set {
				if s.ts[i].state == sEvicting {
					waiting = true
				}
			}
			if !waiting {
				break
			}
			s.step(math.Inf(1))
		}
		var need int64
		for i := range set {
			if st := s.ts[i].state; st == sAbsent || st == sTier {
				need += s.ts[i].bytes
			}
		}
		if !s.makeRoom(need, set) {
			return fail(k, fmt.Sprintf("its %d bytes do not fit in the device capacity of %d bytes", a.OpBytes[k], hw.DeviceBytes)), s.hostNeed
		}
		for i := range set {
			switch s.ts[i].state {
			case sAbsent:
				s.ts[i].state = sDevice
				s.alloc(s.ts[i].bytes)
			case sTier:
				s.fetch(i)
			}
		}
		s.placing = false
		s.tryQueued()
		for {
			waiting := false
			for i := range set {
				if s.ts[i].state != sDevice {
					waiting = true
				}
			}
			if !waiting {
				break
			}
			s.step(math.Inf(1))
		}
		stall := s.now - ready
		r.OpStallNs[k] = roundNs(stall)
		r.OpSlowdown[k] = (float64(op.TimeNs) + stall) / math.Max(1, float64(op.TimeNs))
		if op.TimeNs == 0 && stall == 0 {
			r.OpSlowdown[k] = 1
		}
		for end := s.now + float64(op.TimeNs); s.now < end; {
			s.step(end)
		}
		for i := range set {
			s.ts[i].lastUse = k
			if v := &a.Tensors[i]; !v.Global && v.Death == k {
				s.used -= s.ts[i].bytes
				s.ts[i].state = sAbsent
			}
		}
		for _, m := range evictAfter[k] {
			if i := a.index[m.Tensor]; s.ts[i].state == sDevice {
				s.evict(i, m.Tier)
			}
		}
		s.tryQueued()
	}
	if plan == nil && hw.DeviceBytes == math.MaxInt64 {
		r.TimeNs = a.TotalNs // exact: nothing moves under the ideal policy
	} else {
		r.TimeNs = roundNs(s.now)
	}
	r.StallNs = max(0, r.TimeNs-r.IdealNs)
	r.PeakDeviceBytes = s.peak
	return r, s.hostNeed
}

// maxNs is where simulated times saturate: far beyond any real iteration
// (146 years), below int64's end, so sums and differences of two stay in
// range (a transfer at an absurd bandwidth does not wrap to a negative time).
const maxNs = 1 << 62

// roundNs is f nanoseconds as an int64, saturated at maxNs.
func roundNs(f float64) int64 {
	if !(f < maxNs) {
		return maxNs
	}
	return int64(math.Round(f))
}
