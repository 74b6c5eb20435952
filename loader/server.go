package loader

import (
	"cmp"
	"fmt"
	"slices"
	"sync"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// ServerOptions configure a Server.
type ServerOptions struct {
	// Budget is the memory, in bytes, of the samples held in slots and the
	// chunk files being read (PlanLayout).
	Budget int64 `json:"budget"`
	// Seed seeds the tie-break stream of each epoch (with the epoch).
	Seed uint64 `json:"seed"`
	// Chooser picks the engine of the chunk reads; nil means transfer's
	// default for the pack's directory (O_DIRECT for chunk files from
	// transfer.DirectThreshold where the directory's probe allows it).
	Chooser transfer.Chooser `json:"-"`
	// NoReadAhead turns the read-ahead off (readAhead): every read is
	// then made by the request that needs it, for tests that count them.
	NoReadAhead bool `json:"no_read_ahead"`
	// Overflow is the share of Budget, in [0, 0.9], for the samples a
	// chunk read brings whose slot is occupied: kept as spares of their
	// slot (served before it) while they fit in that share, instead of
	// left unfilled and read again later. 0 is the paper's policy, where
	// they are the wasted part of the read; the slots and reads get the
	// rest of the budget (fewer abstract chunks), at least the pack's
	// MinBudget (the share shrinks to leave it). DefaultOverflow is what
	// pyfastensor uses.
	Overflow float64 `json:"overflow"`
	// Rank and World share the abstract memory among the World servers
	// of a cluster (loader/dist): the layout is planned for the cluster's
	// memory, World times Budget, and this server owns abstract chunk g
	// when g % World == Rank (Layout.Owned), its reads and overflow shares
	// a World-th of the cluster's. World 0 or 1: one node, owning all.
	Rank  int `json:"rank"`
	World int `json:"world"`
}

// DefaultOverflow is the overflow share pyfastensor's datasets use
// (ServerOptions.Overflow). Measured with a random sampler
// (TestOverflowCutsWastedReads, and 20,000 samples in chunks of 64 in
// batches of 256): with the paper's policy 85 to 88% of the bytes read are
// wasted at budgets of 10 to 50% of the data, each chunk read 5 to 7
// times. A group of abstract chunks holds about N ln N samples of chunk
// size N between its misses, so the spares need about 4 times the slots'
// share: with 0.75 of the budget, a budget of 10% of the data still read
// each chunk 3 times (+260% wasted in bench data, 20,000 files of 100 KB);
// with 0.9 every chunk is read once from a budget of 10% of the data.
const DefaultOverflow = 0.9

// RefillReads is the number of chunk reads one batch runs at once (within
// the budget's share for reads). Not measured yet: a few requests queued
// keep a disk busy, and each read is split into engine tasks anyway.
const RefillReads = 4

// ReadAheadLevels is the most samples of its own a slot keeps in memory
// ahead of its requests (Layout.ReadAhead: as many as the overflow share
// has room for). Measured at 100,000 samples of 100 KB (bench data's
// reader alone, 2 workers, one cold epoch each, levels forced): 1 level
// 8,560 samples/s, 2 8,890-9,480, 3 9,370, 4 9,400-10,940, the workers
// waiting in their requests 7.5, 6.5-6.9, 4.1 and 1.4-1.8 s of the
// epoch; without read-ahead 8,700-9,780.
const ReadAheadLevels = 4

// Sample is one delivered sample.
type Sample struct {
	Request  int    `json:"request"`  // the position asked for
	Position int    `json:"position"` // the position delivered (its place in the pack's index)
	Source   int    `json:"source"`   // its index in the PackSpec
	Label    int    `json:"label"`
	Epoch    uint64 `json:"epoch"` // the epoch it was delivered in
	Data     []byte `json:"-"`     // its bytes, the caller's from now on
}

// Stats describe a server's work. The counters are the current epoch's
// (SetEpoch and Restore zero them); PeakBytes is over the server's life.
type Stats struct {
	Epoch      uint64 `json:"epoch"`
	Served     int64  `json:"served"`      // samples delivered
	ChunkReads int64  `json:"chunk_reads"` // whole chunk files read
	// AheadReads of them were started by the read-ahead, before a
	// request needed them (readAhead); the others held up a request.
	AheadReads     int64 `json:"ahead_reads"`
	BytesRead      int64 `json:"bytes_read"` // their bytes
	BytesDelivered int64 `json:"bytes_delivered"`
	// WastedBytes were read but will not be delivered from that read: the
	// samples of a chunk already filled this epoch, slots occupied, the
	// padding.
	WastedBytes int64 `json:"wasted_bytes"`
	// Returned samples were delivered and given back untaken (Return:
	// a worker that died, a caller that failed before taking its batch);
	// they are served again, from memory.
	Returned      int64 `json:"returned"`
	HeldBytes     int64 `json:"held_bytes"`      // in slots now
	InFlightBytes int64 `json:"in_flight_bytes"` // of chunk reads now
	PeakBytes     int64 `json:"peak_bytes"`      // held plus in flight, at most
	Budget        int64 `json:"budget"`
	// IdleSampleBytes is sample memory kept for reuse (samplebuf.go), now
	// and at most: beside the budget, up to its read share.
	IdleSampleBytes     int64 `json:"idle_sample_bytes"`
	PeakIdleSampleBytes int64 `json:"peak_idle_sample_bytes"`
}

// Server serves one opened pack from an abstract memory within a budget:
// the local protocol (refill.go) over the layout of memory.go, planned
// from its options by serverplan.go. Get and
// GetBatch are safe for concurrent callers: one lock guards the
// protocol's state; chunk reads run outside it. The order in which
// concurrent calls take the lock is their request sequence.
type Server struct {
	p     *Packed
	ix    *Index
	lay   Layout
	reads transfer.Options
	sem   *byteSem
	bufs  *bufPool    // the chunk reads' buffers, within the read share
	mem   *samplePool // the samples' memory, reused (samplebuf.go)
	owned []bool      // by abstract chunk
	words int         // bitset words per chunk: ceil(N/64)

	mu        sync.Mutex
	closed    bool
	seed      uint64 // of the tie-break streams (Restore sets it)
	epoch     uint64
	tie       *stream
	ties      []int // choose's scratch
	keepOrder []int // refill's scratch
	noAhead   bool  // ServerOptions.NoReadAhead
	// overflowCap: Layout.OverflowBytes; overflow: the bytes of spares a
	// refill kept there (landed or not).
	overflowCap, overflow int64
	// Per chunk, its positions not filled this epoch (words bits each).
	unfilled bitset
	// Per abstract chunk, its empty slots (words bits each).
	empty bitset
	// Per slot (abstract chunk g's slot k at g*N+k): the chunk whose
	// sample is there (-1: empty), the fill that brought it, its bytes
	// once landed, and the samples of the slot not delivered this epoch.
	slotChunk  []int
	slotFill   []*fill
	slotData   [][]byte
	spares     map[int][]spare // by slot: its samples held outside it
	left       []int
	delivered  bitset // positions delivered this epoch
	nDelivered int
	held       int64 // bytes in slotData
	inflight   int64 // bytes of chunk reads in flight
	stats      Stats
	turns      turnState // the round robin of DataLoader workers' batches (turn.go)
}

// NewServer returns a server of p within o.Budget bytes (PlanLayout: an
// error wrapping ErrBudget when too small), at epoch 0.
func NewServer(p *Packed, o ServerOptions) (*Server, error) {
	lay, readBytes, err := planServer(p.Index, o)
	if err != nil {
		return nil, err
	}
	world := max(o.World, 1)
	chooser := o.Chooser
	if chooser == nil {
		chooser = transfer.Default(p.Dir)
	}
	n, w := lay.ChunkSize, (lay.ChunkSize+63)/64
	s := &Server{p: p, ix: p.Index, lay: lay, seed: o.Seed, reads: transfer.Options{Chooser: chooser}, noAhead: o.NoReadAhead,
		overflowCap: lay.OverflowBytes / int64(world),
		sem:         newByteSem(readBytes), bufs: newBufPool(readBytes), mem: newSamplePool(readBytes), owned: make([]bool, lay.AbstractChunks), words: w,
		unfilled: make(bitset, lay.Chunks*w), empty: make(bitset, lay.AbstractChunks*w),
		slotChunk: make([]int, lay.AbstractChunks*n), slotFill: make([]*fill, lay.AbstractChunks*n),
		slotData: make([][]byte, lay.AbstractChunks*n), left: make([]int, lay.AbstractChunks*n),
		delivered: newBitset(lay.Samples)}
	for _, g := range lay.Owned {
		s.owned[g] = true
	}
	s.stats.Budget = o.Budget
	s.reset(0)
	return s, nil
}

// Layout returns the server's abstract memory layout.
func (s *Server) Layout() Layout {
	l := s.lay
	l.Owned = slices.Clone(l.Owned)
	return l
}

// Len is the number of samples (positions) of the pack.
func (s *Server) Len() int { return s.lay.Samples }

// reset starts epoch e: every sample undelivered, every slot empty, the
// tie-break stream at the epoch's start, the counters zeroed. Fills in
// flight still serve the requests that took their samples.
func (s *Server) reset(e uint64) {
	n, w := s.lay.ChunkSize, s.words
	s.epoch = e
	s.tie = newStream(s.seed, tieStream+e)
	clear(s.unfilled)
	for c := range s.lay.Chunks {
		for k := range s.ix.Chunks[c].Samples {
			s.unfilled[c*w:].set(k)
		}
	}
	for i := range s.empty {
		s.empty[i] = ^uint64(0)
	}
	for i := range s.slotChunk {
		s.slotChunk[i], s.slotFill[i], s.slotData[i], s.left[i] = -1, nil, nil, 0
	}
	s.spares = map[int][]spare{}
	for c := range s.lay.Chunks {
		g := s.lay.group(c)
		for k := range s.ix.Chunks[c].Samples {
			s.left[g*n+k]++
		}
	}
	clear(s.delivered)
	s.nDelivered, s.held, s.overflow = 0, 0, 0
	s.stats = Stats{Epoch: e, PeakBytes: s.stats.PeakBytes, Budget: s.stats.Budget}
	s.turns.reset(0, 0, 0)
}

// SetEpoch starts epoch e: every sample undelivered again, a new
// tie-break stream (seeded by the server's seed and e). Samples held for
// the previous epoch are dropped.
func (s *Server) SetEpoch(e uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.reset(e)
	return nil
}

// Epoch is the current epoch.
func (s *Server) Epoch() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.HeldBytes, st.InFlightBytes = s.held, s.inflight
	st.IdleSampleBytes, st.PeakIdleSampleBytes = s.mem.usage()
	return st
}

// notePeak records the memory now held, if it is the most yet.
func (s *Server) notePeak() {
	s.stats.PeakBytes = max(s.stats.PeakBytes, s.held+s.inflight)
}

// Get serves one request: GetBatch of one.
func (s *Server) Get(i int) (Sample, error) {
	out, err := s.GetBatch([]int{i})
	if err != nil {
		return Sample{}, err
	}
	return out[0], nil
}

// GetBatch serves requests for the positions is, in order (the
// DataLoader's __getitems__): each is answered by the valid sample in its
// slot of its group's abstract chunk, refilled first when empty
// (refill.go), and the sample is invalidated. The batch is admitted whole
// or not at all: a position outside the pack is an error wrapping
// ErrInvalid, one whose slot has no undelivered sample left ErrEpochDone
// (all delivered) or ErrNotPermutation, one of an abstract chunk another
// server owns ErrNotOwned. A damaged chunk met while serving is a
// *CorruptError naming its file and sample; the samples it took are lost
// to the epoch.
func (s *Server) GetBatch(is []int) ([]Sample, error) {
	s.mu.Lock()
	b, err := s.begin(is)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.finish(b)
}

// pending is a batch assigned (its decisions made, under the lock) whose
// reads may still be running.
type pending struct {
	tickets      []ticket
	start, ahead []*fill
}

// begin admits and assigns the batch is under the lock: every decision
// of the batch is made here, in request order.
func (s *Server) begin(is []int) (*pending, error) {
	if err := s.admit(is); err != nil {
		return nil, err
	}
	b := &pending{tickets: make([]ticket, len(is))}
	for k, i := range is {
		t := s.assign(i)
		if f := s.readAhead(s.lay.group(i/s.lay.ChunkSize), i%s.lay.ChunkSize); f != nil {
			b.ahead = append(b.ahead, f)
		}
		if !t.ready && t.err == nil && !t.f.started {
			t.f.started = true
			b.start = append(b.start, t.f)
		}
		b.tickets[k] = t
	}
	return b, nil
}

// finish runs a batch's reads (begin, outside the lock), waits for its
// samples and returns them.
func (s *Server) finish(b *pending) ([]Sample, error) {
	if len(b.ahead) > 0 {
		go s.read(b.ahead)
	}
	s.read(b.start)
	for _, t := range b.tickets {
		if !t.ready && t.err == nil {
			<-t.f.done
		}
	}

	out := make([]Sample, len(b.tickets))
	var first error
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range b.tickets {
		t := &b.tickets[k]
		if !t.ready && t.err == nil {
			t.data, t.err = t.f.out[t.pos], cmp.Or(t.f.err, t.f.bad[t.pos])
			delete(t.f.out, t.pos)
		}
		if t.err != nil {
			first = cmp.Or(first, t.err)
			continue
		}
		e := &s.ix.Samples[t.pos]
		out[k] = Sample{Request: t.req, Position: t.pos, Source: e.Source, Label: e.Label, Epoch: s.epoch, Data: t.data}
	}
	if first != nil {
		return nil, first
	}
	return out, nil
}

// admit checks a batch before any of it is served.
func (s *Server) admit(is []int) error {
	if s.closed {
		return ErrClosed
	}
	if len(is) > 0 && s.nDelivered == s.lay.Samples {
		return fmt.Errorf("loader: %w: epoch %d delivered all %d samples; SetEpoch starts the next", ErrEpochDone, s.epoch, s.lay.Samples)
	}
	n := s.lay.ChunkSize
	var asked map[int]int
	for _, i := range is {
		if i < 0 || i >= s.lay.Samples {
			return fmt.Errorf("%w: position %d outside the pack's 0..%d", ErrInvalid, i, s.lay.Samples-1)
		}
		g := s.lay.group(i / n)
		if !s.owned[g] {
			return fmt.Errorf("loader: %w: position %d maps to abstract chunk %d", ErrNotOwned, i, g)
		}
		x := g*n + i%n
		if len(is) == 1 {
			if s.left[x] == 0 {
				return s.overAsked(i, g, 1)
			}
			continue
		}
		if asked == nil {
			asked = make(map[int]int, len(is))
		}
		if asked[x]++; asked[x] > s.left[x] {
			return s.overAsked(i, g, asked[x])
		}
	}
	return nil
}

// overAsked is the error for a request at position i beyond its slot's
// undelivered samples.
func (s *Server) overAsked(i, g, asked int) error {
	n := s.lay.ChunkSize
	x := g*n + i%n
	lo, hi := s.lay.groupChunks(g)
	return fmt.Errorf("loader: %w: position %d: slot %d of abstract chunk %d (chunks %d..%d) has %d undelivered samples left in epoch %d, and %d requests ask for one "+
		"(an epoch asks for each position once: a sampler that repeats one, a resumed loader that asks again for what its state served, "+
		"or persistent DataLoader workers still fetching a cut-short epoch's batches after set_epoch)",
		ErrNotPermutation, i, i%n, g, lo, hi-1, s.left[x], s.epoch, asked)
}

// read runs the chunk reads of fills this caller took on, RefillReads at
// once, each within the budget's share for reads, and lands them. A fill
// whose task did not run to its end (a recovered panic, or a task skipped
// after it) lands with the error, so no request waits for it forever.
func (s *Server) read(fills []*fill) {
	if len(fills) == 0 {
		return
	}
	err := transfer.Run(len(fills), RefillReads, func(k int) error {
		s.readFill(fills[k])
		return nil
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range fills {
		if !f.landed {
			if err == nil {
				err = fmt.Errorf("%w: loader: the read of %s did not finish", gds.ErrInternal, s.p.ChunkPath(f.chunk))
			}
			s.land(f, nil, 0, err, nil)
		}
	}
}

// readFill reads a fill's chunk, checks the CRC-32 of each sample it
// fills (a damaged one fails only the request that takes it), and lands
// it. A panic (recovered by transfer.Run) still lands the
// fill, with an error, and gives its memory back.
func (s *Server) readFill(f *fill) {
	size := s.ix.Chunks[f.chunk].Length
	s.sem.acquire(size)
	s.mu.Lock()
	s.inflight += size
	s.notePeak()
	s.mu.Unlock()
	var buf []byte
	var data [][]byte
	var err error
	var bad map[int]error
	free := func() {}
	finished := false
	defer func() {
		s.mu.Lock()
		if !finished {
			buf, data, err = nil, nil, fmt.Errorf("%w: loader: the read of %s failed", gds.ErrInternal, s.p.ChunkPath(f.chunk))
		}
		s.land(f, data, int64(len(buf)), err, bad)
		s.inflight -= size
		s.mu.Unlock()
		free()
		s.sem.release(size)
	}()
	buf, free, err = readChunk(s.p, f.chunk, s.reads, s.bufs)
	if err == nil {
		// Each sample checked and copied out of the chunk's buffer here,
		// outside the lock (a chunk of 6 MiB took milliseconds under it,
		// and the other requesters waited).
		data = make([][]byte, len(f.samples))
		for k, pos := range f.samples {
			if e := checkSample(s.p, pos, buf); e != nil {
				if bad == nil {
					bad = map[int]error{}
				}
				bad[pos] = e
				continue
			}
			e := &s.ix.Samples[pos]
			data[k] = s.mem.get(int(e.Length))
			copy(data[k], buf[e.Offset:e.Offset+e.Length])
		}
	}
	finished = true
}

// Return gives back samples a GetBatch delivered that their requester
// did not take (a DataLoader worker that died holding its batch, a caller
// that failed before copying it out): each is undelivered again and held
// in memory outside its slot until a request for its slot takes it (such
// a request is served by it before the slot). Exactly once per epoch then
// still holds when the requests that got them are asked again. Samples of
// another epoch than the current one (SetEpoch or Restore since), or not
// delivered now, are dropped. Given-back bytes count as held, and may take
// the memory over the budget by the batches given back. Their order is
// part of the request sequence the delivered order is a function of.
func (s *Server) Return(samples []Sample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := len(samples) - 1; k >= 0; k-- { // each to the head of its slot's queue: in order
		smp := samples[k]
		if s.closed || smp.Epoch != s.epoch || smp.Position < 0 || smp.Position >= s.lay.Samples ||
			!s.delivered.has(smp.Position) {
			continue
		}
		s.giveBack(smp)
	}
}

// Release gives back the memory of samples GetBatch delivered whose bytes
// their requester copied out and no longer touches (nor gives back): later
// reads reuse it (samplebuf.go). Not releasing a sample is safe; the
// collector takes its memory then.
func (s *Server) Release(samples []Sample) {
	for _, smp := range samples {
		s.mem.put(smp.Data)
	}
}

// Close refuses further requests. Reads in flight finish for the requests
// waiting on them.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}
