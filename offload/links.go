package offload

import "sort"

// timeline is the planner's estimate of one link direction's use: the
// stretches of time (ns, from the iteration's start) during which
// transfers already planned keep it busy at full bandwidth. A planned
// transfer of d ns of link time takes the first d ns the link has free
// after it is issued (an eviction) or the last d ns free before it is
// needed (a prefetch, as late as it can safely go: the latest safe
// prefetch time of section 4.4, with the traffic counted).
//
// The simulator shares a link among the transfers on it rather than
// queueing them, so a timeline is an estimate of when transfers end, not
// a schedule: what it gets right is that the bytes a link carries in a
// stretch of time never exceed its bandwidth times that time.
type timeline struct {
	busy []span // sorted by start, disjoint, not touching
}

type span struct{ s, e float64 }

// eps is the link time (ns) below which a transfer counts as carried.
const eps = 1e-6

// forward returns the free stretches that carry d ns of link time from
// from on, and when the last of them ends.
func (l *timeline) forward(from, d float64) ([]span, float64) {
	var got []span
	t := from
	i := sort.Search(len(l.busy), func(i int) bool { return l.busy[i].e > from })
	for d > eps {
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
func (l *timeline) backward(until, d float64) ([]span, float64) {
	var got []span
	t := until
	i := sort.Search(len(l.busy), func(i int) bool { return l.busy[i].s >= until }) - 1 // last to start before until
	for d > eps {
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
