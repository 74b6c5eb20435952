package loader

import (
	"fmt"
	"math/rand/v2"
)

// The abstract memory (the paper's section 3.2), sized from a byte budget.
//
// Consecutive chunks form groups of G chunks (the last group may have
// fewer); each group maps to one abstract chunk of N slots, N the chunk
// size: slot k holds at most one sample, the k-th of one of the group's
// chunks. Memory is taken as samples land and given back as they are
// delivered, so a slot's share of the budget is the largest sample any of
// the group's chunks has at that slot; an abstract chunk's share is the sum
// over its slots (SlotBytes sums them over all abstract chunks). The rest
// of the budget is for chunk files being read (ReadBytes), each read
// taking its chunk file's length until its samples are copied out; it must
// hold the largest chunk file.
//
// G is the least that fits: more abstract chunks mean more samples in
// memory at once, each request served by a sample drawn from fewer chunks
// (the least G, one, serves every request with the very sample asked for,
// all the data in memory by the end of the epoch). The greatest, every
// chunk in one group, is the least memory a pack can be served from:
// MinBudget. With an overflow share (ServerOptions.Overflow) a server then
// widens the groups until the share holds the spares a random epoch
// leaves (widen, spareBytes): those, not the slots, fill its memory.

// Layout is how a server maps a pack onto its abstract memory.
type Layout struct {
	Samples        int   `json:"samples"`
	ChunkSize      int   `json:"chunk_size"` // N: the slots of an abstract chunk
	Chunks         int   `json:"chunks"`
	ChunksPerGroup int   `json:"chunks_per_group"` // G
	AbstractChunks int   `json:"abstract_chunks"`  // the groups: ceil(Chunks / G)
	Budget         int64 `json:"budget"`
	SlotBytes      int64 `json:"slot_bytes"`      // the slots' share of the budget
	ReadBytes      int64 `json:"read_bytes"`      // the reads' share: Budget - OverflowBytes - SlotBytes
	OverflowBytes  int64 `json:"overflow_bytes"`  // the spares' share (ServerOptions.Overflow)
	MaxChunkBytes  int64 `json:"max_chunk_bytes"` // the largest chunk file
	MinBudget      int64 `json:"min_budget"`      // the least budget this pack can be served from
	// EpochBudget is about the least budget from which a random sampler's
	// epoch reads each chunk once (the widest groups, their spares as
	// spareBytes predicts them with SpareMargin, at the server's overflow
	// share); 0 where the server keeps no spares (ServerOptions.Overflow 0).
	EpochBudget int64 `json:"epoch_budget"`
	// ReadAhead is how many of its samples a slot keeps in memory ahead
	// of its requests (refill.go, readAhead): the most levels, up to
	// ReadAheadLevels, whose spares spareBytes predicts within the
	// overflow share (aheadLevels); 0 reads on demand only.
	ReadAhead int `json:"read_ahead"`
	// Owned lists the abstract chunks this server owns: all of them on
	// one node; a distributed server would own a disjoint share and send
	// requests for the others to their owners.
	Owned []int `json:"owned"`
}

// PlanLayout sizes the abstract memory of a server of ix within budget
// bytes: the least G whose SlotBytes and the largest chunk file fit. A
// budget below MinBudget is an error wrapping ErrBudget that names both
// and the chunk size in bytes.
func PlanLayout(ix *Index, budget int64) (Layout, error) {
	l := Layout{Samples: len(ix.Samples), ChunkSize: ix.ChunkSize, Chunks: len(ix.Chunks), Budget: budget}
	var total int64
	for _, c := range ix.Chunks {
		l.MaxChunkBytes = max(l.MaxChunkBytes, c.Length)
		total += c.DataLength
	}
	one := slotBytes(ix, l.Chunks)
	l.MinBudget = one + l.MaxChunkBytes
	if budget < l.MinBudget {
		return Layout{}, fmt.Errorf("loader: %w: a budget of %d bytes is below the %d bytes this pack needs at the least: "+
			"one abstract chunk of %d slots (%d bytes: each slot's largest sample) and one chunk read in flight (the largest chunk file, %d bytes)",
			ErrBudget, budget, l.MinBudget, ix.ChunkSize, one, l.MaxChunkBytes)
	}
	avail := budget - l.MaxChunkBytes
	// slotBytes(G) >= total/G (a slot's largest sample is at least the
	// group's average there), so no G below ceil(total/avail) fits: the
	// search starts there. hi always fits; lo never does (or is 0).
	lo, hi := 0, l.Chunks
	if avail > 0 {
		lo = int(min(int64(l.Chunks), (total+avail-1)/avail)) - 1
		lo = max(lo, 0)
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if slotBytes(ix, mid) <= avail {
			hi = mid
		} else {
			lo = mid
		}
	}
	l.ChunksPerGroup = hi
	l.AbstractChunks = (l.Chunks + hi - 1) / hi
	l.SlotBytes = slotBytes(ix, hi)
	l.ReadBytes = budget - l.SlotBytes
	l.Owned = make([]int, l.AbstractChunks)
	for g := range l.Owned {
		l.Owned[g] = g
	}
	return l, nil
}

// slotBytes is the memory the slots of abstract chunks of groups of g
// chunks take at most: for each group, the sum over slots of the largest
// sample the group's chunks have there.
func slotBytes(ix *Index, g int) int64 {
	n := ix.ChunkSize
	largest := make([]int64, n)
	var total int64
	for lo := 0; lo < len(ix.Chunks); lo += g {
		clear(largest)
		for c := lo; c < min(lo+g, len(ix.Chunks)); c++ {
			for k := range ix.Chunks[c].Samples {
				largest[k] = max(largest[k], ix.Samples[c*n+k].Length)
			}
		}
		for _, v := range largest {
			total += v
		}
	}
	return total
}

// group is the abstract chunk chunk c maps to.
func (l *Layout) group(c int) int { return c / l.ChunksPerGroup }

// groupChunks is the chunks [lo, hi) of group g.
func (l *Layout) groupChunks(g int) (lo, hi int) {
	return g * l.ChunksPerGroup, min((g+1)*l.ChunksPerGroup, l.Chunks)
}

// SpareMargin is how far above the predicted peak of the spares
// (spareBytes) the overflow share must reach for a layout to be taken as
// serving a random sampler without re-reads: another request order peaks
// elsewhere, by up to a fifth with one or two groups (their peak is that
// of a few random walks; many groups average out).
const SpareMargin = 1.1

// spareOrders is the number of random request orders spareBytes replays.
const spareOrders = 2

// spareBytes predicts the most bytes the spares of groups of g chunks hold
// at once over an epoch of a random sampler's requests: the overflow
// share they need so that no chunk is read twice. Each read of a group's
// chunk puts one sample in each of its N slots, and a read is made when a
// request finds its slot with none left, so after r_k requests at slot k
// the group has read max_k r_k chunks and holds N max r - sum r samples,
// N of them in its slots; a read-ahead of levels keeps max r up to levels
// above the slot just requested (refill.go, readAhead). Replayed over
// spareOrders random orders (fixed seeds: a layout is a function of the
// pack and the budget), the most held beyond the slots, in samples of the
// pack's mean size. In theory r_k at a fraction t of the epoch is about
// Binomial(G, t), so a group holds about N (m sqrt(G)/2 - 1) spares at the
// epoch's middle, m the expected largest of N standard normals (2.34 for
// N = 64): a fraction of the data of about m/(2 sqrt(G)), 11% at G = 112,
// falling only as groups grow. The peak over the epoch lies above that
// middle, by a third for a single group, hence the replay.
func spareBytes(ix *Index, g, levels int) int64 {
	chunks, n, samples := len(ix.Chunks), ix.ChunkSize, len(ix.Samples)
	if chunks == 0 || samples == 0 {
		return 0
	}
	var total int64
	for _, c := range ix.Chunks {
		total += c.DataLength
	}
	groups := (chunks + g - 1) / g
	r, most := make([]int32, groups*n), make([]int32, groups)
	var peak int64
	for order := range spareOrders {
		clear(r)
		clear(most)
		var held, top int64 // samples read and not yet requested, slots' included
		for _, i := range rand.New(rand.NewPCG(spareSeed, uint64(order))).Perm(samples) {
			grp := i / n / g
			x := grp*n + i%n
			if r[x]++; r[x] > most[grp] { // the read the request waits for
				most[grp]++
				held += int64(n)
			}
			if int(most[grp]-r[x]) < levels && int(most[grp]) < min(g, chunks-grp*g) { // the read-ahead
				most[grp]++
				held += int64(n)
			}
			top = max(top, held)
			held--
		}
		peak = max(peak, top-int64(groups*n))
	}
	return max(0, peak) * total / int64(samples)
}

// aheadLevels is Layout.ReadAhead for lay: the most levels whose spares
// spareBytes predicts within the overflow share. The layout keeps
// SpareMargin above the spares of reads on demand; the read-ahead takes
// room from that margin, and where an order's spares peak higher the
// server stops reading ahead while the share lacks a chunk's room per
// abstract chunk (readAhead), so the reads on demand still keep theirs
// (a spare dropped costs its chunk a second read). At 100,000 samples of
// 100 KB in chunks of 64 and a budget of 10% of the data (bench data's
// default), the spares are predicted at 780 MiB, 817, 855, 892 and 930
// MiB for 0 to 4 levels, in a share of 879 MiB (2 levels); an epoch read
// ahead by 4 peaked at 856 MiB of spares and read each chunk once.
func aheadLevels(ix *Index, lay Layout) int {
	l := 0 // the spares grow with the levels: the first that does not fit ends the replays
	for l < ReadAheadLevels && spareBytes(ix, lay.ChunksPerGroup, l+1) <= lay.OverflowBytes {
		l++
	}
	return l
}

// spareSeed seeds spareBytes' request orders.
const spareSeed = 0x5ba4e
