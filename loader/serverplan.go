package loader

import (
	"fmt"
	"math"
)

// The layout a server plans from its options (NewServer): the abstract
// memory of the pack within the budget (PlanLayout, memory.go), then the
// overflow share, the groups widened until that share holds a random
// epoch's spares, the read-ahead levels, and in a cluster which abstract
// chunks this server owns and its share of the reads.

// planServer returns the layout of a server of the pack ix with options
// o, and the bytes of its chunk reads in flight at most.
func planServer(ix *Index, o ServerOptions) (lay Layout, readBytes int64, err error) {
	if !(o.Overflow >= 0 && o.Overflow <= 0.9) {
		return Layout{}, 0, fmt.Errorf("%w: overflow %v outside 0..0.9", ErrInvalid, o.Overflow)
	}
	world := max(o.World, 1)
	if o.Rank < 0 || o.Rank >= world || o.Budget > (1<<62)/int64(world) {
		return Layout{}, 0, fmt.Errorf("%w: rank %d of a world of %d with a budget of %d bytes each", ErrInvalid, o.Rank, o.World, o.Budget)
	}
	budget := o.Budget * int64(world) // the cluster's
	lay, err = PlanLayout(ix, budget)
	if err != nil {
		return Layout{}, 0, err
	}
	// The overflow share, down to what leaves the slots and reads their
	// least: a budget that serves the pack at all takes any overflow. Of
	// what it takes, a cluster's reads get up to RefillReads chunk reads at
	// once per server (extra: RefillReads-1 chunks beyond the layout's one,
	// at most a sixteenth of the share: the spares save more reads than
	// overlapping them gains). A server of a cluster has a world-th of the
	// layout's read share, a chunk at the least, and its reads come at the
	// pace of every node's requests: with one read in flight, 4 nodes of
	// bench data-nodes on a throttled disk left it idle between reads
	// (epoch 1.03x that of a single-node loader per node; 0.90x with the
	// extra). One node keeps the layout's share (not measured to gain: its
	// spares matter more at small budgets, overflow_test.go).
	over := min(int64(float64(budget)*o.Overflow), budget-lay.MinBudget)
	var extra int64
	if world > 1 {
		extra = min(int64(RefillReads-1)*lay.MaxChunkBytes*int64(world), over/16)
		over -= extra
	}
	for over > 0 {
		plan, err := PlanLayout(ix, budget-over-extra)
		if err != nil {
			return Layout{}, 0, err
		}
		// In a cluster, the overflow share gives way (halving) until every
		// server owns an abstract chunk, where the budget allows.
		if plan.AbstractChunks >= min(world, lay.AbstractChunks) {
			lay = plan
			lay.Budget, lay.OverflowBytes, lay.ReadBytes = budget, over, plan.ReadBytes+extra
			break
		}
		if over /= 2; over < 1024 {
			break // no overflow: the most abstract chunks
		}
	}
	if lay.OverflowBytes > 0 {
		lay = widen(ix, lay, int64(float64(budget)*o.Overflow)-extra, world)
		lay.EpochBudget = epochBudget(ix, lay, o.Overflow, world)
		if !o.NoReadAhead {
			lay.ReadAhead = aheadLevels(ix, lay)
		}
	}
	readBytes = lay.ReadBytes
	if world > 1 {
		lay.Owned = lay.Owned[:0]
		for g := range lay.AbstractChunks {
			if g%world == o.Rank {
				lay.Owned = append(lay.Owned, g)
			}
		}
		readBytes = max(lay.ReadBytes/int64(world), lay.MaxChunkBytes)
	}
	return lay, readBytes, nil
}

// widen returns lay with its groups widened to the least G whose overflow
// share holds the spares a random sampler's epoch is predicted to need
// (spareBytes times SpareMargin), from lay's G (the least whose slots and
// reads fit beside the overflow share) up to the greatest that leaves
// minGroups abstract chunks (a cluster's servers each own one). The slots
// shrink as G grows and the overflow share takes what they give back, up
// to maxOver (the option's share); the rest goes to the reads. Sized for
// the slots alone, the groups stay narrow while the spares need a share
// that falls only as 1/sqrt(G): at 100,000 samples in chunks of 64 and a
// budget of 10% of the data, G = 112 left 14 abstract chunks whose spares
// needed 11% of the data, and 37% more bytes were read than delivered.
// When no G fits, the widest (the least spares).
func widen(ix *Index, lay Layout, maxOver int64, minGroups int) Layout {
	reads := lay.ReadBytes
	over := func(g int) (slots, over int64) {
		slots = slotBytes(ix, g)
		return slots, max(0, min(maxOver, lay.Budget-slots-reads))
	}
	fits := func(g int) bool {
		_, o := over(g)
		return float64(spareBytes(ix, g, 0))*SpareMargin <= float64(o)
	}
	lo, hi := lay.ChunksPerGroup, max(lay.ChunksPerGroup, lay.Chunks/max(minGroups, 1))
	if lo == hi || fits(lo) {
		return lay
	}
	if fits(hi) { // lo never fits, hi always: the least that does
		for hi-lo > 1 {
			mid := lo + (hi-lo)/2
			if fits(mid) {
				hi = mid
			} else {
				lo = mid
			}
		}
	}
	slots, o := over(hi)
	lay.ChunksPerGroup, lay.AbstractChunks = hi, (lay.Chunks+hi-1)/hi
	lay.SlotBytes, lay.OverflowBytes, lay.ReadBytes = slots, o, lay.Budget-slots-o
	lay.Owned = make([]int, lay.AbstractChunks)
	for g := range lay.Owned {
		lay.Owned[g] = g
	}
	return lay
}

// epochBudget is Layout.EpochBudget for a server of a world of servers
// (each server's share of the cluster's) with an overflow share of over:
// at the widest groups, room for their slots, one chunk read and the
// spares with SpareMargin, those within the share.
func epochBudget(ix *Index, lay Layout, over float64, world int) int64 {
	g := max(1, lay.Chunks/world)
	need := int64(math.Ceil(float64(spareBytes(ix, g, 0)) * SpareMargin))
	total := max(int64(math.Ceil(float64(need)/over)), need+slotBytes(ix, g)+lay.MaxChunkBytes)
	return (total + int64(world) - 1) / int64(world)
}
