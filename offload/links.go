package offload

import (
	"math"
	"sort"
)

// timeline is the planner's estimate of one link direction's use: the
// stretches of time (ns, from the iteration's start) during which
// transfers already planned keep it busy at full bandwidth. A planned
// transfer of d ns of link time takes the first d ns the link has free
// after it is issued (an eviction) or the last d ns free before it is
// needed (a prefetch, as late as it can safely go: the latest safe
// prefetch time of section 4.4, with the traffic counted).
//
// The simulator serves a link's transfers one at a time, the one needed
// soonest first, not in the order the timelines reserve them, so a
// timeline is an estimate of when transfers end, not a schedule: what it
// gets right is that the bytes a link carries in a
// stretch of time never exceed its bandwidth times that time.
//
// Times are whole nanoseconds: every step of forward and backward either
// passes a busy stretch or carries at least 1 ns of the transfer, so they
// end after at most len(busy) + 1 stretches at any magnitude of time (a
// float64 clock near 1e11 ns cannot tell t from t + 1e-5).
type timeline struct {
	busy []span // sorted by start, disjoint, not touching
}

type span struct{ s, e int64 }

// linkNs is the whole nanoseconds of link time that bytes take at bps,
// rounded up (so a transfer of any bytes takes at least 1 ns).
func linkNs(bytes int64, bps float64) int64 {
	if bytes <= 0 {
		return 0
	}
	ns := math.Ceil(float64(bytes) / bps * 1e9)
	if ns >= math.MaxInt64/4 {
		return math.MaxInt64 / 4
	}
	return int64(ns)
}

// forward returns the free stretches that carry d ns of link time from
// from on, and when the last of them ends.
func (l *timeline) forward(from, d int64) ([]span, int64) {
	var got []span
	t := from
	i := sort.Search(len(l.busy), func(i int) bool { return l.busy[i].e > from })
	for d > 0 {
		if i < len(l.busy) && l.busy[i].s <= t {
			t = l.busy[i].e
			i++
			continue
		}
		end := t + d
		if i < len(l.busy) {
			end = min(end, l.busy[i].s)
		}
		got = append(got, span{t, end})
		d -= end - t
		t = end
	}
	return got, t
}

// backward returns the free stretches that carry d ns of link time ending
// at until or before, and when the first of them starts (it may be
// negative: before the iteration starts).
func (l *timeline) backward(until, d int64) ([]span, int64) {
	var got []span
	t := until
	i := sort.Search(len(l.busy), func(i int) bool { return l.busy[i].s >= until }) - 1 // last to start before until
	for d > 0 {
		if i >= 0 && l.busy[i].e >= t {
			t = min(t, l.busy[i].s)
			i--
			continue
		}
		start := t - d
		if i >= 0 {
			start = max(start, l.busy[i].e)
		}
		got = append(got, span{start, t})
		d -= t - start
		t = start
	}
	return got, t
}

// reserve marks the stretches busy (stretches forward or backward
// returned, so free ones).
func (l *timeline) reserve(spans []span) {
	if len(spans) == 0 {
		return
	}
	all := append(append([]span(nil), l.busy...), spans...)
	sort.Slice(all, func(i, j int) bool { return all[i].s < all[j].s })
	out := all[:1]
	for _, x := range all[1:] {
		if last := &out[len(out)-1]; x.s <= last.e {
			last.e = max(last.e, x.e)
			continue
		}
		out = append(out, x)
	}
	l.busy = out
}
