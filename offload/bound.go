package offload

import "math"

// A lower bound on the time of an iteration at a device capacity, from the
// bytes that must cross the links whatever the plan: no policy the
// simulator runs can beat it, so a policy's distance from it is what a
// better planner could still win, and ideal's distance from it is what
// physics costs.

// BoundNs returns a lower bound on the simulated time of one iteration of a
// valid trace on hw, under any plan (0 when one op alone needs more than
// the device holds: nothing runs).
//
// The argument, for ops a < b with S_k the time op k starts:
//
//   - At S_a at most C = hw.DeviceBytes bytes are on the device (memory of
//     transfers under way counts as held), so of the bytes alive during op
//     a that ops a..b use, all but C are in a tier at S_a and must be read
//     back before S_b: reads(a, b) = (that sum - C)+.
//   - Likewise at S_b: of the bytes alive during op b that ops a..b use, all
//     but C are in a tier, written out after their last use in a..b-1, so
//     after S_a: writes(a, b) = (that sum - C)+.
//   - So S_b - S_a >= max(the op times of a..b-1, reads(a, b) / read
//     bandwidth, writes(a, b) / write bandwidth), where a direction's
//     bandwidth is the SSD's plus the host link's (host memory permitting;
//     the simulator gives each its own channel). Latencies are left out.
//   - Host memory holds at most hw.HostBytes of those bytes (a transfer
//     under way counts there too), and nothing moves between host memory
//     and the SSD: the rest of reads(a, b) and writes(a, b) cross the SSD's
//     link, at its bandwidth alone.
//
// The bound is the best sum of these over a partition of the iteration into
// consecutive stretches (a dynamic program over op boundaries), plus the
// last op's time. With memory to spare it is the sum of op times.
func BoundNs(t *Trace, hw Hardware) int64 {
	return boundNs(Analyze(t), t, hw, true)
}

// boundNs is BoundNs; without host it leaves out host memory's capacity
// (the links' bound alone: every byte off the device could be in host
// memory).
func boundNs(a *Analysis, t *Trace, hw Hardware, host bool) int64 {
	return newBoundInput(a, t).ns(hw, host)
}

// boundInput is what the bound needs of a trace whatever the hardware:
// for ops x < b, the bytes alive during op x whose next use at or after x
// is in x..b (usedA[x][b-x]), and the bytes alive during op b whose last
// use at or before b is in x..b (usedB[b][b-x]). Made once, it gives the
// bound on many hardware in time quadratic in the ops, without the
// tensors' lists.
type boundInput struct {
	a            *Analysis
	t            *Trace
	usedA, usedB [][]int64
}

func newBoundInput(a *Analysis, t *Trace) *boundInput {
	n := len(t.Ops)
	bi := &boundInput{a: a, t: t, usedA: make([][]int64, n), usedB: make([][]int64, n)}
	// alive[k]: the tensors alive during op k (indexes into a.Tensors).
	alive := make([][]int, n)
	for i := range a.Tensors {
		v := &a.Tensors[i]
		for k := v.Birth; k >= 0 && k <= v.Death; k++ {
			alive[k] = append(alive[k], i)
		}
	}
	cnt := make([]int64, n)
	for b := 0; b < n; b++ {
		clear(cnt)
		for _, i := range alive[b] {
			if lu := lastUseAtOrBefore(a.Tensors[i].Uses, b); lu >= 0 {
				cnt[lu] += a.Tensors[i].Bytes
			}
		}
		row := make([]int64, b+1)
		var s int64
		for k := b; k >= 0; k-- {
			s += cnt[k]
			row[b-k] = s
		}
		bi.usedB[b] = row
	}
	for x := 0; x < n; x++ {
		clear(cnt)
		for _, i := range alive[x] {
			if nu := nextUseAtOrAfter(a.Tensors[i].Uses, x); nu >= 0 {
				cnt[nu] += a.Tensors[i].Bytes
			}
		}
		row := make([]int64, n-x)
		var s int64
		for b := x; b < n; b++ {
			s += cnt[b]
			row[b-x] = s
		}
		bi.usedA[x] = row
	}
	return bi
}

// ns is the bound on hw (boundNs).
func (bi *boundInput) ns(hw Hardware, host bool) int64 {
	a, t := bi.a, bi.t
	n := len(t.Ops)
	if n == 0 {
		return 0
	}
	capB := hw.DeviceBytes
	for _, b := range a.OpBytes {
		if b > capB {
			return 0
		}
	}
	readBps, writeBps := hw.SSDReadBps, hw.SSDWriteBps
	hostB := int64(math.MaxInt64 / 4)
	if host {
		hostB = hw.HostBytes
	}
	if hw.HostBytes > 0 {
		readBps += hw.HostLinkBps
		writeBps += hw.HostLinkBps
	}
	starts := a.OpStartNs
	// best[b]: the bound on S_b.
	best := make([]float64, n)
	for x := 0; x < n; x++ {
		usedA := bi.usedA[x]
		for b := x + 1; b < n; b++ {
			lb := float64(starts[b] - starts[x])
			if r := usedA[b-x] - capB; r > 0 {
				lb = max(lb, float64(r)/readBps*1e9)
				if r -= hostB; r > 0 {
					lb = max(lb, float64(r)/hw.SSDReadBps*1e9)
				}
			}
			if w := bi.usedB[b][b-x] - capB; w > 0 {
				lb = max(lb, float64(w)/writeBps*1e9)
				if w -= hostB; w > 0 {
					lb = max(lb, float64(w)/hw.SSDWriteBps*1e9)
				}
			}
			best[b] = max(best[b], best[x]+lb)
		}
	}
	last := best[n-1] + float64(t.Ops[n-1].TimeNs)
	return max(a.TotalNs, roundNs(last))
}

// nextUseAtOrAfter returns the first of the ascending uses at or after k,
// or -1.
func nextUseAtOrAfter(uses []int, k int) int {
	lo, hi := 0, len(uses)
	for lo < hi {
		m := (lo + hi) / 2
		if uses[m] < k {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(uses) {
		return uses[lo]
	}
	return -1
}

// lastUseAtOrBefore returns the last of the ascending uses at or before k,
// or -1.
func lastUseAtOrBefore(uses []int, k int) int {
	lo, hi := 0, len(uses)
	for lo < hi {
		m := (lo + hi) / 2
		if uses[m] <= k {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo > 0 {
		return uses[lo-1]
	}
	return -1
}
