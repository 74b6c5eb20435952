package loader

import (
	"cmp"
	"math/bits"
	"slices"
)

// The local protocol (the paper's section 3.3), on the server's state,
// under its lock. Decisions are bookkeeping only, made in request order:
// which sample a request gets, which chunk refills an abstract chunk and
// which of its samples land in which slots. The bytes follow: a refill is
// a fill, whose chunk read runs outside the lock (server.go); a request
// given a sample whose fill has not landed yet waits for it. So the
// delivered order is a function of (seed, epoch, request sequence) alone,
// whatever the reads' timing.

// fill is one refill of an abstract chunk with chunk's samples.
type fill struct {
	chunk   int
	samples []int         // the positions it fills, in slot order
	started bool          // a caller has taken on its read
	landed  bool          // the read finished (err says how)
	err     error         // the read failed: every sample of the fill fails with it
	bad     map[int]error // a sample whose CRC-32 failed, by position
	done    chan struct{} // closed when landed
	// out holds the bytes of samples requests took before the fill
	// landed: a key (with a nil value) for each such request until then.
	out map[int][]byte
}

func newFill(chunk int) *fill {
	return &fill{chunk: chunk, done: make(chan struct{}), out: map[int][]byte{}}
}

// ticket is one request's answer: the position of the sample it gets, and
// either its bytes (ready) or the fill to wait for.
type ticket struct {
	req   int
	pos   int
	f     *fill
	data  []byte
	ready bool
	err   error
}

// spare is an undelivered sample of a slot held outside it: one a
// requester gave back without taking it (Return: data, ready), one a
// refill kept in the overflow share (extra), or, after
// Restore, a second filled sample of one slot (f: its fill, read when a
// request takes it). A request is served from its slot's spares first, in
// their queue's order (given-back samples at its head, kept ones in the
// order refills kept them), before the slot.
type spare struct {
	pos   int
	f     *fill
	data  []byte
	ready bool
	extra bool // kept by a refill in the overflow share (refill)
}

// assign answers the request for position i (admitted: its slot has an
// undelivered sample), from the slot's spares first, else from the slot,
// refilling the abstract chunk when i's slot is empty, and invalidates
// what it served.
func (s *Server) assign(i int) ticket {
	n := s.lay.ChunkSize
	c, j := i/n, i%n
	g := s.lay.group(c)
	x := g*n + j
	if sp := s.spares[x]; len(sp) > 0 {
		e := sp[0]
		if s.spares[x] = sp[1:]; len(sp) == 1 {
			delete(s.spares, x)
		}
		t := ticket{req: i, pos: e.pos, f: e.f}
		if e.extra {
			s.overflow -= s.ix.Samples[e.pos].Length
		}
		switch {
		case e.ready:
			t.data, t.ready = e.data, true
			s.held -= int64(len(e.data))
		case e.f.landed:
			t.err = cmp.Or(e.f.err, e.f.bad[e.pos])
		default:
			e.f.out[e.pos] = nil
		}
		s.deliver(x, e.pos)
		return t
	}
	if s.slotChunk[x] < 0 {
		s.refill(g, s.choose(g, j))
	}
	f := s.slotFill[x]
	pos := s.slotChunk[x]*n + j
	t := ticket{req: i, pos: pos, f: f}
	switch {
	case f.landed && f.err == nil && f.bad[pos] == nil:
		t.data, t.ready = s.slotData[x], true
		s.held -= int64(len(t.data))
	case f.landed:
		t.err = cmp.Or(f.err, f.bad[pos])
	default:
		f.out[pos] = nil
	}
	s.slotChunk[x], s.slotFill[x], s.slotData[x] = -1, nil, nil
	s.empty[g*s.words:].set(j)
	s.deliver(x, pos)
	return t
}

// deliver records position pos, of slot x, delivered.
func (s *Server) deliver(x, pos int) {
	s.delivered.set(pos)
	s.nDelivered++
	s.left[x]--
	s.stats.Served++
	s.stats.BytesDelivered += s.ix.Samples[pos].Length
}

// giveBack undoes deliver for a sample its requester did not take: it
// becomes its slot's first spare, with its bytes.
func (s *Server) giveBack(smp Sample) {
	n := s.lay.ChunkSize
	pos := smp.Position
	x := s.lay.group(pos/n)*n + pos%n
	data := smp.Data
	if data == nil {
		data = []byte{}
	}
	// First in its slot's queue: asked again, the request that got it gets it.
	s.spares[x] = append([]spare{{pos: pos, data: data, ready: true}}, s.spares[x]...)
	s.delivered.unset(pos)
	s.nDelivered--
	s.left[x]++
	s.held += int64(len(data))
	s.stats.Served--
	s.stats.BytesDelivered -= s.ix.Samples[pos].Length
	s.stats.Returned++
	s.notePeak()
}

// choose picks the chunk that refills group g for a request at slot j:
// among the group's chunks whose sample at j was not filled this epoch,
// the one that fills the most empty slots (the paper's fill rate: the
// highest fills the most and wastes the least of its read), ties broken
// by the epoch's tie-break stream. The caller has checked that one
// exists. j < 0 (a read-ahead, for no request yet) picks among all the
// group's chunks, -1 when none fills a slot.
func (s *Server) choose(g, j int) int {
	w := s.words
	empty := s.empty[g*w : (g+1)*w]
	lo, hi := s.lay.groupChunks(g)
	best := -1
	s.ties = s.ties[:0]
	for c := lo; c < hi; c++ {
		unfilled := s.unfilled[c*w : (c+1)*w]
		if j >= 0 && !unfilled.has(j) {
			continue
		}
		fillable := 0
		for k := range unfilled {
			fillable += bits.OnesCount64(unfilled[k] & empty[k])
		}
		if j < 0 && fillable == 0 {
			continue
		}
		switch {
		case fillable > best:
			best, s.ties = fillable, append(s.ties[:0], c)
		case fillable == best:
			s.ties = append(s.ties, c)
		}
	}
	switch len(s.ties) {
	case 0:
		return -1
	case 1:
		return s.ties[0]
	}
	return s.ties[s.tie.uniform(uint64(len(s.ties)))]
}

// readAhead starts a refill before any request needs it, after a request
// at slot j of abstract chunk g, in two cases. The request left every
// slot of g empty (a sampler that finished a group, a sequential one) and
// g has samples left to fill: the chunk choose picks for no slot in
// particular. Or it left slot j with fewer than Layout.ReadAhead of its
// samples in memory (low) while the overflow share has a chunk's room per
// abstract chunk this server owns (what their reads on demand keep): the
// chunk choose picks for j, a read j's requests would make later, made
// now. With a random sampler the second case is the common one: each
// group reads up to ReadAhead levels ahead of its requests (a chunk per
// level, so no more reads; a chunk's samples more held per level and
// group), and the read overlaps the requester's other work instead of
// holding up the request that meets the empty slot. Decided
// under the lock per request, like a request's own refill, so the order
// stays a function of (seed, epoch, request sequence), whatever the
// batching; the caller reads the fill without waiting for it. nil when
// there is none to start.
func (s *Server) readAhead(g, j int) *fill {
	if s.noAhead {
		return nil
	}
	c := -1
	switch {
	case s.allEmpty(g) && !s.hasSpares(g):
		c = s.choose(g, -1)
	case s.low(g, j) && s.overflowCap-s.overflow >= s.lay.MaxChunkBytes*int64(len(s.lay.Owned)):
		c = s.choose(g, j)
	}
	if c < 0 {
		return nil
	}
	f := s.refill(g, c)
	f.started = true
	s.stats.AheadReads++
	return f
}

// allEmpty reports whether every slot of abstract chunk g is empty.
func (s *Server) allEmpty(g int) bool {
	n, w := s.lay.ChunkSize, s.words
	for k, word := range s.empty[g*w : (g+1)*w] {
		all := ^uint64(0) // the word's bits of slots
		if rest := n - 64*k; rest < 64 {
			all = 1<<rest - 1
		}
		if word&all != all {
			return false // a slot holds a sample
		}
	}
	return true
}

// low reports whether slot j of abstract chunk g holds fewer than
// Layout.ReadAhead of its undelivered samples in memory (its own and its
// spares) and has more left: a read for it is due.
func (s *Server) low(g, j int) bool {
	x := g*s.lay.ChunkSize + j
	held := len(s.spares[x])
	if !s.empty[g*s.words:].has(j) {
		held++
	}
	return held < s.lay.ReadAhead && s.left[x] > held
}

// hasSpares reports whether a slot of abstract chunk g holds spares.
func (s *Server) hasSpares(g int) bool {
	n := s.lay.ChunkSize
	for x := g * n; x < (g+1)*n; x++ {
		if len(s.spares[x]) > 0 {
			return true
		}
	}
	return false
}

// refill fills every empty slot of group g whose sample in chunk c was not
// filled this epoch with that sample (a valid slot is never touched:
// never evict a sample not yet consumed), as a new fill. The chunk's
// other samples not filled this epoch, whose slots are occupied, are kept
// as spares of their slots while they fit the overflow share
// (ServerOptions.Overflow), the slots with the fewest spares first; the
// rest are the read's waste.
func (s *Server) refill(g, c int) *fill {
	n, w := s.lay.ChunkSize, s.words
	empty, unfilled := s.empty[g*w:(g+1)*w], s.unfilled[c*w:(c+1)*w]
	f := newFill(c)
	for k := range s.ix.Chunks[c].Samples {
		if !empty.has(k) || !unfilled.has(k) {
			continue
		}
		x := g*n + k
		s.slotChunk[x], s.slotFill[x], s.slotData[x] = c, f, nil
		empty.unset(k)
		unfilled.unset(k)
		f.samples = append(f.samples, c*n+k)
	}
	if s.overflowCap == 0 {
		return f
	}
	// The slots with the fewest spares first: when the share cannot keep
	// them all, what it drops is for the slots whose requests are furthest
	// off (each slot's requests come at the same rate), and the re-reads
	// grow with the shortfall (TestShortOverflowKeepsTheSlotsWithFewestSpares).
	keep := s.keepOrder[:0]
	for k := range s.ix.Chunks[c].Samples {
		if unfilled.has(k) {
			keep = append(keep, k)
		}
	}
	slices.SortStableFunc(keep, func(a, b int) int { return len(s.spares[g*n+a]) - len(s.spares[g*n+b]) })
	s.keepOrder = keep
	for _, k := range keep {
		size := s.ix.Samples[c*n+k].Length
		if s.overflow+size > s.overflowCap {
			continue
		}
		x := g*n + k
		s.spares[x] = append(s.spares[x], spare{pos: c*n + k, f: f, extra: true})
		s.overflow += size
		unfilled.unset(k)
		f.samples = append(f.samples, c*n+k)
	}
	return f
}

// land distributes a fill's samples (data[k] holds the bytes of
// f.samples[k], copied out of the chunk's read bytes; or the error that
// took them): each sample a request took goes to the fill's out, each still in
// its slot to the slot, but the damaged ones (bad), which fail the
// requests that take them. A sample whose slot was reset since (SetEpoch,
// Restore) is dropped.
func (s *Server) land(f *fill, data [][]byte, read int64, err error, bad map[int]error) {
	f.landed, f.bad = true, bad
	if data != nil {
		s.stats.ChunkReads++
		s.stats.BytesRead += read
	}
	if err != nil {
		f.err = err
		close(f.done)
		return
	}
	n := s.lay.ChunkSize
	var useful int64
	for k, pos := range f.samples {
		e := &s.ix.Samples[pos]
		if bad[pos] != nil {
			continue
		}
		b := data[k]
		if _, taken := f.out[pos]; taken {
			f.out[pos] = b
			useful += e.Length
			continue
		}
		x := s.lay.group(f.chunk)*n + pos%n
		if s.slotFill[x] == f && s.slotChunk[x]*n+pos%n == pos {
			s.slotData[x] = b
			s.held += e.Length
			useful += e.Length
			continue
		}
		for k := range s.spares[x] {
			if sp := &s.spares[x][k]; sp.f == f && sp.pos == pos && !sp.ready {
				sp.data, sp.ready = b, true
				s.held += e.Length
				useful += e.Length
			}
		}
	}
	s.stats.WastedBytes += read - useful
	s.notePeak()
	close(f.done)
}
