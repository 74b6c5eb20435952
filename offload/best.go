package offload

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
)

// MakePlan returns the fastest of the candidate migration plans for a trace
// on hw, as Simulate replays them on hw: so a plan for more device memory,
// more host memory or faster links is never slower than one for less.
//
// The candidates are G10's planner (smart eviction, Algorithm 1, then
// smart prefetching, section 4.4) run for every point of a fixed grid of
// hardware (PlanGrid: memory at or below hw's, links up to twice hw's),
// each in four variants: the SSD
// first (G10's order) or each migration on whichever link its planned
// traffic leaves the wider window (so the SSD and the host link share the
// load), each with the section's windows (uncontended transfers) or the
// windows the links' planned traffic leaves. Each plan runs within the
// device and host memory it was made for (Capacity, HostCapacity), so on
// more of either it takes the same time; on faster links the replay was
// not slower in 39,992 of 40,000 random replays (TestFixedPlanOnMoreResources).
// The grid does not depend on hw: more of any resource only adds
// candidates.
//
// Most of the grid is never planned. A grid cell of device and host
// memory whose BoundNs (on hw's links) is not below the best plan so far
// holds no faster plan, nor does any cell with less memory; and nothing
// is made after the first plan that runs in ideal time, nor a plan (and
// replay) that would come out the same as one made for more host memory.
// Planning for slower links than there is leaves slack that the replay can
// use.
//
// It fails, wrapping ErrInfeasible and naming the capacity, when one op
// alone needs more than the device holds; otherwise the planned peak never
// exceeds hw.DeviceBytes, and with memory to spare the plan is empty.
func MakePlan(t *Trace, hw Hardware) (MigrationPlan, error) {
	p, _, err := bestPlan(t, hw)
	return p, err
}

// planVariants lists the variants of the planner each grid point is
// planned with, in the order the candidates are made (the first of
// equally fast plans is kept).
var planVariants = []planVariant{{TierSSD, false}, {tierEither, false}, {TierSSD, true}, {tierEither, true}}

// The grid MakePlan plans on, fixed for every hardware and anchored at
// G10Artifact (so the artifact's hardware is a point of it): device memory
// at 40 GiB times 2^(i/8), host memory at 128 GiB times 2^(j/4) (and
// none), the three link bandwidths together at the artifact's times
// 2^(k/2) (the artifact's proportions). Device memory also has two points
// of each trace's own: its largest op (the least any plan needs) and its
// peak demand (where nothing moves).
const (
	devSteps  = 8 // grid points per doubling of device memory
	hostSteps = 4 // and of host memory
	linkSteps = 2 // and of the links' bandwidth
)

// PlanGrid returns the grid points MakePlan may plan t for on hw: the
// device and host memory sizes at or below hw's, largest first, and the
// link bandwidths, fastest first (the SSD's read and write and the host
// link's, as Hardware fields). The links run from twice hw's slowest link,
// relative to the artifact's, down to a floor of the trace's own (or the
// floor alone, for hardware slower than it): its peak demand over its
// iteration time, over 8, on the SSD read axis. A device
// size below the trace's largest op, or a host size below its smallest
// tensor (that holds nothing, as none does), is left out. Each set only
// grows with hw.
func PlanGrid(t *Trace, hw Hardware) (dev, host []int64, links []Hardware) {
	return planGrid(Analyze(t), hw)
}

func planGrid(a *Analysis, hw Hardware) (dev, host []int64, links []Hardware) {
	art := G10Artifact()
	lo, hi := int64(0), int64(0)
	for k := range a.OpBytes {
		lo = max(lo, a.OpBytes[k])
		hi = max(hi, a.Pressure[k])
	}
	if hw.DeviceBytes >= hi {
		dev = append(dev, hi)
	}
	for i := gridLevel(float64(hw.DeviceBytes), float64(art.DeviceBytes), devSteps); ; i-- {
		d := int64(gridAt(float64(art.DeviceBytes), i, devSteps))
		if d < lo || d <= 0 { // d reaches 0: nothing is live (lo 0), no size below it to try
			break
		}
		if d < hi {
			dev = append(dev, d)
		}
	}
	if hw.DeviceBytes >= lo && (len(dev) == 0 || dev[len(dev)-1] != lo) {
		dev = append(dev, lo)
	}
	least := int64(math.MaxInt64)
	for i := range a.Tensors {
		if b := a.Tensors[i].Bytes; b > 0 {
			least = min(least, b)
		}
	}
	if hw.HostBytes > 0 {
		for j := gridLevel(float64(hw.HostBytes), float64(art.HostBytes), hostSteps); ; j-- {
			h := int64(gridAt(float64(art.HostBytes), j, hostSteps))
			if h < least {
				break
			}
			host = append(host, h)
		}
	}
	host = append(host, 0)
	// The links' floor is the trace's own, so a change of unit by a power
	// of two moves hw, the floor and the top by whole octaves.
	rate := float64(hi) / float64(max(1, a.TotalNs)) * 1e9 / 8
	floor := gridLevel(max(rate, 1), art.SSDReadBps, linkSteps)
	top := min(gridLevel(hw.SSDReadBps, art.SSDReadBps, linkSteps), gridLevel(hw.SSDWriteBps, art.SSDWriteBps, linkSteps),
		gridLevel(hw.HostLinkBps, art.HostLinkBps, linkSteps)) + linkSteps
	for k := max(top, floor); k >= floor; k-- {
		h := Hardware{SSDReadBps: gridAt(art.SSDReadBps, k, linkSteps), SSDWriteBps: gridAt(art.SSDWriteBps, k, linkSteps),
			HostLinkBps: gridAt(art.HostLinkBps, k, linkSteps)}
		links = append(links, h)
	}
	return dev, host, links
}

// gridAt is the grid point anchor * 2^(level/steps).
func gridAt(anchor float64, level, steps int) float64 {
	return anchor * math.Exp2(float64(level)/float64(steps))
}

// gridLevel is the level of the largest grid point at or below x.
func gridLevel(x, anchor float64, steps int) int {
	l := int(math.Floor(float64(steps) * math.Log2(x/anchor)))
	for gridAt(anchor, l+1, steps) <= x {
		l++
	}
	for gridAt(anchor, l, steps) > x {
		l--
	}
	return l
}

// bestPlan is MakePlan with the chosen plan's simulated result on hw. The
// grid's memory cells are visited largest first, host memory in the outer
// loop: a cell's bound rises as either memory shrinks, so the cells not
// yet ruled out form a staircase. A cell's candidates are made and
// replayed in parallel (up to GOMAXPROCS at once); the choice does not
// depend on the order they finish in.
func bestPlan(t *Trace, hw Hardware) (MigrationPlan, Result, error) {
	if err := t.Validate(); err != nil {
		return MigrationPlan{}, Result{}, err
	}
	if err := hw.Validate(); err != nil {
		return MigrationPlan{}, Result{}, err
	}
	in := newPlanInput(t)
	devs, hosts, links := planGrid(in.a, hw)
	if len(devs) == 0 {
		// One op alone does not fit hw: the planner names it.
		_, err := in.plan(hw, planVariants[0])
		return MigrationPlan{}, Result{}, err
	}
	var bi *boundInput // made on the first cell after the first
	best := struct {
		p MigrationPlan
		r Result
	}{r: Result{TimeNs: math.MaxInt64}}
	ideal := func() bool { return best.r.TimeNs <= in.a.TotalNs }
	rows := len(devs) // cells of the host row above not ruled out
	per := len(links) * len(planVariants)
	needs := make([]int64, len(devs)*per) // bestOfCell's need, by device size
	for n := range needs {
		needs[n] = -1
	}
	for _, h := range hosts {
		i := 0
		for ; i < rows && !ideal(); i++ {
			cell := hw
			cell.DeviceBytes, cell.HostBytes = devs[i], h
			if best.r.TimeNs < math.MaxInt64 {
				if bi == nil {
					bi = newBoundInput(in.a, t)
				}
				if bi.ns(cell, true) >= best.r.TimeNs {
					break // nor can any cell with less device memory
				}
			}
			if p, r, ok := bestOfCell(in, hw, cell, links, needs[i*per:(i+1)*per]); ok && r.TimeNs < best.r.TimeNs {
				best.p, best.r = p, r
			}
		}
		if i == 0 || ideal() {
			break // nor can any cell with less host memory
		}
		rows = i
	}
	if best.r.TimeNs == math.MaxInt64 {
		// No candidate replays feasibly (not seen: every op fits): the
		// plan for hw itself, with the replay's reason.
		p, err := in.plan(hw, planVariants[0])
		return p, simulate(in.a, t, hw, &p), err
	}
	return best.p, best.r, nil
}

// bestOfCell makes the candidates for one memory cell (each link
// bandwidth of the grid, each variant), replays them on hw and returns
// the fastest (the first of equally fast ones), or false when none is
// feasible. Candidates after the first that runs in ideal time are not
// made, nor those made already for more host memory: need[n] is the host
// memory down to which candidate n's plan and its replay stay the same
// (-1: not made yet), so it would take the same time as the one made,
// which comes first. need is updated.
func bestOfCell(in *planInput, hw, cell Hardware, links []Hardware, need []int64) (MigrationPlan, Result, bool) {
	type job struct {
		p  MigrationPlan
		r  Result
		ok bool
	}
	jobs := make([]job, len(links)*len(planVariants))
	var idealAt atomic.Int64
	idealAt.Store(int64(len(jobs)))
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(1, runtime.GOMAXPROCS(0)))
	for n := range jobs {
		if need[n] >= 0 && need[n] <= cell.HostBytes {
			continue
		}
		sem <- struct{}{}
		if idealAt.Load() < int64(n) {
			<-sem
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			g := cell
			l := links[n/len(planVariants)]
			g.SSDReadBps, g.SSDWriteBps, g.HostLinkBps = l.SSDReadBps, l.SSDWriteBps, l.HostLinkBps
			p, hn, err := in.planNeed(g, planVariants[n%len(planVariants)])
			if err != nil {
				return
			}
			host := g.HostBytes
			p.HostCapacity = &host
			r, rn := simulateNeed(in.a, in.t, hw, &p)
			need[n] = max(hn, rn)
			j := &jobs[n]
			j.p, j.r = p, r
			j.ok = j.r.Feasible
			if j.ok && j.r.TimeNs <= in.a.TotalNs {
				for at := idealAt.Load(); int64(n) < at && !idealAt.CompareAndSwap(at, int64(n)); at = idealAt.Load() {
				}
			}
		}()
	}
	wg.Wait()
	best := -1
	for n := range jobs {
		if jobs[n].ok && (best < 0 || jobs[n].r.TimeNs < jobs[best].r.TimeNs) {
			best = n
		}
	}
	if best < 0 {
		return MigrationPlan{}, Result{}, false
	}
	return jobs[best].p, jobs[best].r, true
}
