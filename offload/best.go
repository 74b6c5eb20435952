package offload

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// MakePlan returns the fastest of several candidate migration plans for a
// trace on hw, as Simulate replays them on hw. Each hardware of the ladder
// (PlanLadder: hw, then hw with less device memory, host memory or
// bandwidth) is planned with each of four variants of G10's planner (smart
// eviction, Algorithm 1, then smart prefetching, section 4.4): the SSD
// first (G10's order) or each migration on whichever link its planned
// traffic leaves the wider window (so the SSD and the host link share the
// load), each with the section's windows (uncontended transfers) or the
// windows the links' planned traffic leaves. A plan made for less device
// memory is replayed both within its own capacity and with all of hw's.
//
// So the result is never slower than any plan for the ladder's lesser
// hardware; a plan for more device memory, host memory or faster links is
// rarely slower than one for less, not never: the plan for hw itself is
// not a candidate on other hardware, and it can be the fastest there is
// (here 5 of 3,000 random pairs, by up to 7%). A fixed plan replayed on
// more of any resource is not slower (Simulate). Planning for less memory
// or slower links than there is leaves slack that the replay can use.
// The candidates after the first that runs in ideal time are not made.
//
// It fails, wrapping ErrInfeasible and naming the capacity, when one op
// alone needs more than the device holds; otherwise the planned peak never
// exceeds hw.DeviceBytes (Capacity is the capacity the chosen plan runs
// within, at most that), and with memory to spare the plan is empty.
func MakePlan(t *Trace, hw Hardware) (MigrationPlan, error) {
	p, _, err := bestPlan(t, hw)
	return p, err
}

// planVariants lists the variants of the planner each hardware of the
// ladder is planned with, in the order the candidates are made (the first
// of equally fast plans is kept).
var planVariants = []planVariant{{TierSSD, false}, {tierEither, false}, {TierSSD, true}, {tierEither, true}}

// PlanLadder returns the hardware MakePlan makes candidate plans for: hw
// itself first, then hw with less device memory (a quarter cell below it
// and the points 1, 2, 4 and 8 cells below it of a grid of 64 cells from
// the largest op's bytes to the trace's peak demand, where the device still
// holds every op), with half its host memory, and with two thirds and half
// its bandwidths.
func PlanLadder(t *Trace, hw Hardware) []Hardware {
	return planLadder(Analyze(t), hw)
}

func planLadder(a *Analysis, hw Hardware) []Hardware {
	lo, hi := int64(0), int64(0)
	for k := range a.OpBytes {
		lo = max(lo, a.OpBytes[k])
		hi = max(hi, a.Pressure[k])
	}
	out := []Hardware{hw}
	if q := (hi - lo) / 64; q > 0 && hw.DeviceBytes < hi {
		// Points of a grid fixed by the trace, so that the ladders of
		// nearby capacities share them: 1, 2, 4 and 8 cells below.
		// And a quarter cell below hw: the greedy planner's choices
		// shift with the capacity, a little less memory can plan better.
		g := lo + (hw.DeviceBytes-1-lo)/q*q
		cs := []int64{hw.DeviceBytes - max(1, q/4)}
		for _, k := range []int64{0, 1, 3, 7} {
			cs = append(cs, g-k*q)
		}
		for i, c := range cs {
			if c >= lo && c < hw.DeviceBytes && (i == 0 || c != cs[0]) {
				h := hw
				h.DeviceBytes = c
				out = append(out, h)
			}
		}
	}
	if hw.HostBytes > 0 {
		h := hw
		h.HostBytes /= 2
		out = append(out, h)
	}
	for _, f := range []float64{1.5, 2} {
		h := hw
		h.SSDReadBps /= f
		h.SSDWriteBps /= f
		h.HostLinkBps /= f
		out = append(out, h)
	}
	return out
}

// bestPlan is MakePlan with the chosen plan's simulated result on hw. The
// candidates are made and replayed in parallel (up to GOMAXPROCS at once);
// the choice does not depend on the order they finish in.
func bestPlan(t *Trace, hw Hardware) (MigrationPlan, Result, error) {
	if err := t.Validate(); err != nil {
		return MigrationPlan{}, Result{}, err
	}
	if err := hw.Validate(); err != nil {
		return MigrationPlan{}, Result{}, err
	}
	in := newPlanInput(t)
	type job struct {
		hw  Hardware
		v   planVariant
		p   MigrationPlan
		r   Result
		err error
	}
	var jobs []*job
	for _, h := range planLadder(in.a, hw) {
		for _, v := range planVariants {
			jobs = append(jobs, &job{hw: h, v: v})
		}
	}
	// idealAt: the first candidate that runs in ideal time (none is
	// faster); the candidates after it need not be made, and those before
	// it always are, so the choice is the same as with all of them.
	var idealAt atomic.Int64
	idealAt.Store(int64(len(jobs)))
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(1, runtime.GOMAXPROCS(0)))
	for i, j := range jobs {
		sem <- struct{}{}
		if idealAt.Load() < int64(i) { // a candidate before it runs in ideal time: so do all after it
			<-sem
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			j.p, j.err = in.plan(j.hw, j.v)
			if j.err != nil {
				return
			}
			j.r = simulate(in.a, t, hw, &j.p)
			if j.r.Feasible && j.r.TimeNs <= in.a.TotalNs {
				for at := idealAt.Load(); int64(i) < at && !idealAt.CompareAndSwap(at, int64(i)); at = idealAt.Load() {
				}
			}
			if j.p.Capacity < hw.DeviceBytes {
				// The plan for less memory, also given all of hw's.
				wide := j.p
				wide.Capacity = hw.DeviceBytes
				if r := simulate(in.a, t, hw, &wide); r.Feasible && r.TimeNs < j.r.TimeNs {
					j.p, j.r = wide, r
				}
			}
		}()
	}
	wg.Wait()
	if err := jobs[0].err; err != nil {
		return jobs[0].p, Result{}, err // one op alone does not fit hw
	}
	best := jobs[0]
	for _, j := range jobs[1:] {
		if j.err == nil && j.r.Feasible && (!best.r.Feasible || j.r.TimeNs < best.r.TimeNs) {
			best = j
		}
	}
	return best.p, best.r, nil
}
