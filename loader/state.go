package loader

import (
	"encoding/hex"
	"fmt"
	"slices"
)

// A server's state mid-epoch, for a resume in a new process: which
// samples were filled (read into memory) and which delivered this epoch,
// and the tie-break stream's position. The samples filled and not yet
// delivered are the ones in slots and their spares (given back by
// Return); a restored server reads their chunks again when a request
// takes one.
// Restored from the same state, a server answers the same requests with
// the same samples as the server the state was taken from would have.

// StateVersion is the version of State this build writes and reads.
const StateVersion = 1

// State is a server's state, JSON-able (the bitmaps as base64).
type State struct {
	Version int `json:"version"`
	// Pack identifies the pack: its spec hash (hex) and index CRC-32.
	Pack     string `json:"pack"`
	IndexCRC uint32 `json:"index_crc"`
	// ChunksPerGroup is the layout's G: a server restoring the state must
	// map chunks to abstract chunks alike.
	ChunksPerGroup int    `json:"chunks_per_group"`
	Seed           uint64 `json:"seed"`
	Epoch          uint64 `json:"epoch"`
	Draws          uint64 `json:"draws"` // the tie-break stream's position
	Served         int    `json:"served"`
	// Filled and Delivered are bitmaps over positions (bit i of byte
	// i/8): read into memory, and delivered, this epoch.
	Filled    []byte `json:"filled"`
	Delivered []byte `json:"delivered"`
	// Spares are the positions given back (Server.Return) and not yet
	// delivered again, held outside their slots: by slot, in the order
	// they will be served. Every other position filled and not delivered
	// is in its slot.
	Spares []int `json:"spares,omitempty"`
}

// State returns the server's state. Requests in flight count as served:
// take it between batches (after a training step), when none is.
func (s *Server) State() (State, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return State{}, ErrClosed
	}
	return s.state(), nil
}

// state is State under the lock.
func (s *Server) state() State { return s.stateParts().build() }

// stateParts is what a State is made of, copied from the server: taken
// under the lock (a copy of its bitsets' words), built into the State
// outside it (a loop over every sample), so that a state asked with every
// batch does not hold the other workers' batches up.
type stateParts struct {
	st                 State // all but Filled
	unfilled           bitset
	samples, size, per int // samples, chunk size, unfilled's words per chunk
}

// stateParts copies the server's state; under the lock.
func (s *Server) stateParts() stateParts {
	var spares []int
	for x := range s.slotChunk {
		for _, sp := range s.spares[x] {
			spares = append(spares, sp.pos)
		}
	}
	n := s.lay.Samples
	return stateParts{
		st: State{Version: StateVersion, Pack: hex.EncodeToString(s.ix.SpecHash[:]), IndexCRC: s.ix.CRC,
			ChunksPerGroup: s.lay.ChunksPerGroup, Seed: s.seed, Epoch: s.epoch, Draws: s.tie.draws,
			Served: s.nDelivered, Delivered: s.delivered.bytes(n), Spares: spares},
		unfilled: slices.Clone(s.unfilled), samples: n, size: s.lay.ChunkSize, per: s.words,
	}
}

// build is the State of the parts: the samples whose positions are filled.
func (p stateParts) build() State {
	filled := newBitset(p.samples)
	for i := range p.samples {
		if !p.unfilled[(i/p.size)*p.per:].has(i % p.size) {
			filled.set(i)
		}
	}
	p.st.Filled = filled.bytes(p.samples)
	return p.st
}

// Restore puts the server in state st, taken by State from a server of the
// same pack and layout (else an error wrapping ErrState that says what
// differs). The server's seed becomes the state's. Requests for exactly
// the positions not yet requested in st's epoch then deliver exactly the
// samples not yet delivered, each once.
func (s *Server) Restore(st State) error {
	n, size := s.lay.Samples, s.lay.ChunkSize
	bad := func(format string, args ...any) error {
		return fmt.Errorf("loader: %w: %s", ErrState, fmt.Sprintf(format, args...))
	}
	filled, ok1 := bitsetOf(st.Filled, n)
	delivered, ok2 := bitsetOf(st.Delivered, n)
	switch pack := hex.EncodeToString(s.ix.SpecHash[:]); {
	case st.Version < 1 || st.Version > StateVersion:
		return bad("state version %d (this build reads 1 to %d)", st.Version, StateVersion)
	case st.Pack != pack || st.IndexCRC != s.ix.CRC:
		return bad("the state is of pack %s (index CRC-32 %#08x), this server's is %s (%#08x)", st.Pack, st.IndexCRC, pack, s.ix.CRC)
	case st.ChunksPerGroup != s.lay.ChunksPerGroup:
		return bad("the state's layout groups %d chunks per abstract chunk, this server's budget of %d bytes gives %d",
			st.ChunksPerGroup, s.lay.Budget, s.lay.ChunksPerGroup)
	case !ok1 || !ok2:
		return bad("bitmaps of %d and %d bytes for %d samples", len(st.Filled), len(st.Delivered), n)
	case st.Draws > 4*uint64(n)+64:
		// A tie-break is at most one per refill, one per sample, and a
		// draw is rarely rejected.
		return bad("a tie-break stream position of %d for %d samples", st.Draws, n)
	}
	isSpare := map[int]bool{}
	for _, i := range st.Spares {
		switch {
		case i < 0 || i >= n:
			return bad("spare position %d outside the pack's 0..%d", i, n-1)
		case isSpare[i]:
			return bad("spare position %d listed twice", i)
		case !filled.has(i) || delivered.has(i):
			return bad("spare position %d is not filled and undelivered", i)
		}
		isSpare[i] = true
	}
	inSlot := make([]int, s.lay.AbstractChunks*size) // position+1 in each slot
	count := 0
	for i := range n {
		switch {
		case delivered.has(i) && !filled.has(i):
			return bad("position %d delivered but never filled", i)
		case delivered.has(i):
			count++
		case filled.has(i) && !isSpare[i]:
			x := s.lay.group(i/size)*size + i%size
			if inSlot[x] != 0 {
				return bad("positions %d and %d both in slot %d of abstract chunk %d", inSlot[x]-1, i, i%size, x/size)
			}
			inSlot[x] = i + 1
		}
	}
	if count != st.Served {
		return bad("%d samples served, %d delivered", st.Served, count)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.seed = st.Seed
	s.reset(st.Epoch)
	s.tie.skip(st.Draws)
	fills := map[int]*fill{}
	for i := range n {
		if !filled.has(i) {
			continue
		}
		c, k := i/size, i%size
		x := s.lay.group(c)*size + k
		s.unfilled[c*s.words:].unset(k)
		if delivered.has(i) {
			s.delivered.set(i)
			s.nDelivered++
			s.left[x]--
			continue
		}
		f := fills[c]
		if f == nil {
			f = newFill(c)
			fills[c] = f
		}
		f.samples = append(f.samples, i)
		if !isSpare[i] {
			s.slotChunk[x], s.slotFill[x] = c, f
			s.empty[(x/size)*s.words:].unset(k)
		}
	}
	for _, i := range st.Spares {
		x := s.lay.group(i/size)*size + i%size
		s.spares[x] = append(s.spares[x], spare{pos: i, f: fills[i/size], extra: true})
		s.overflow += s.ix.Samples[i].Length
	}
	s.stats.Served = int64(s.nDelivered)
	return nil
}

// A DataLoader's workers each hold part of a mid-epoch state: the
// positions their batches delivered. A request for position i is answered
// by a sample of i's slot (its chunk group's abstract chunk, slot i%N), so
// for any set of batches the requests they made and the samples they
// delivered balance slot by slot. A loader that checkpoints the batches
// its training loop consumed (torchdata's StatefulDataLoader keeps, per
// worker, the state that came with the worker's last batch it yielded)
// thus has, in the union of its workers' parts, exactly the samples those
// batches delivered; the rest of the epoch's requests (the sampler resumes
// after the consumed batches) then ask, slot by slot, for as many samples
// as the union leaves. A state restored from the union has those samples
// delivered and nothing else in memory: the samples the workers had
// prefetched past the consumed batches are read again when asked for.
//
// Served in turn (turn.go), a loader's batches are decided in its order,
// and a worker's part can be the server's whole state right after its
// last batch (WorkerPartTurnVersion): the part of the worker whose batch
// was consumed last is then the state the consumed batches left, and
// restored it continues as the server it was taken from would have (the
// same samples in the same batches), where the union of the delivered
// positions restarts the epoch's reads.

// WorkerPartKind is the Kind of a WorkerPart.
const WorkerPartKind = "worker"

// WorkerPartVersion is the version of a WorkerPart of delivered
// positions (Delivered): their union is restored.
const WorkerPartVersion = 1

// WorkerPartTurnVersion is the version of a WorkerPart of a worker served
// in turn (Batch, State): the part of the latest batch is restored. This
// build writes it (LocalHello's part) and reads both.
const WorkerPartTurnVersion = 2

// StateHead is what a state is of: the pack, the layout, the seed and the
// epoch (State's fields of the same names).
type StateHead struct {
	Pack           string `json:"pack"`
	IndexCRC       uint32 `json:"index_crc"`
	ChunksPerGroup int    `json:"chunks_per_group"`
	Seed           uint64 `json:"seed"`
	Epoch          uint64 `json:"epoch"`
}

// WorkerPart is one DataLoader worker's part of a mid-epoch state in the
// head's epoch. Of version WorkerPartVersion: the positions its batches
// delivered, a bitmap as in State (base64 in JSON). Of version
// WorkerPartTurnVersion: how many batches were served in turn up to its
// last one (Batch: that one's index plus one; 0 when it had none this
// epoch) and the server's state right after it (InTurn.State). The
// worker fills in its id, the number of workers and the rest; the head
// is the server's (Server.Head).
type WorkerPart struct {
	Kind    string `json:"kind"`
	Version int    `json:"version"`
	StateHead
	Worker     int    `json:"worker"`
	NumWorkers int    `json:"num_workers"`
	Delivered  []byte `json:"delivered,omitempty"`
	Batch      uint64 `json:"batch,omitempty"`
	State      *State `json:"state,omitempty"`
}

// Head returns what the server's state now is of.
func (s *Server) Head() StateHead {
	s.mu.Lock()
	defer s.mu.Unlock()
	return StateHead{Pack: hex.EncodeToString(s.ix.SpecHash[:]), IndexCRC: s.ix.CRC,
		ChunksPerGroup: s.lay.ChunksPerGroup, Seed: s.seed, Epoch: s.epoch}
}

// RestoreParts puts the server in the state a loader's workers' parts
// (one per worker, any order) make. Of WorkerPartTurnVersion: the state
// of the part with the latest batch (none: the epoch's start), its epoch's
// batches then served in turn from the worker after that part's. Of
// WorkerPartVersion: their union, their epoch and seed, every position a
// part holds delivered, nothing else in memory. Parts that do not make
// one state (a worker missing or twice, parts of other epochs, seeds,
// versions or loaders, a position in two parts, two parts of one batch)
// or are of another pack or layout are an error wrapping ErrState that
// says which; the server is then unchanged.
func (s *Server) RestoreParts(parts []WorkerPart) error {
	if len(parts) > 0 && parts[0].Version == WorkerPartTurnVersion {
		return s.restoreTurn(parts)
	}
	st, err := UnionState(parts, s.lay.Samples)
	if err != nil {
		return err
	}
	return s.Restore(st)
}

// UnionState returns the state of the union of a loader's workers' parts
// over a pack of n samples (RestoreParts). Draws is 0: the epoch's
// tie-break stream starts again.
func UnionState(parts []WorkerPart, n int) (State, error) {
	bad := func(format string, args ...any) (State, error) {
		return State{}, fmt.Errorf("loader: %w: %s", ErrState, fmt.Sprintf(format, args...))
	}
	if len(parts) == 0 {
		return bad("no DataLoader worker's part")
	}
	first := parts[0]
	seen := make([]bool, max(first.NumWorkers, 0))
	union := newBitset(n)
	count := 0
	for k, p := range parts {
		switch {
		case p.Kind != WorkerPartKind:
			return bad("a part of kind %q, not a DataLoader worker's (%q)", p.Kind, WorkerPartKind)
		case p.Version < 1 || p.Version > WorkerPartVersion:
			return bad("worker %d's part is of version %d (this build reads 1 to %d)", p.Worker, p.Version, WorkerPartVersion)
		}
		if m := partMismatch(first, p, seen); m != "" {
			return bad("%s", m)
		}
		seen[p.Worker] = true
		b, ok := bitsetOf(p.Delivered, n)
		if !ok {
			return bad("worker %d's bitmap of %d bytes for %d samples", p.Worker, len(p.Delivered), n)
		}
		for i := range n {
			if !b.has(i) {
				continue
			}
			if union.has(i) {
				other := slices.IndexFunc(parts[:k], func(q WorkerPart) bool { b, _ := bitsetOf(q.Delivered, n); return b.has(i) })
				return bad("position %d delivered by both worker %d and worker %d", i, parts[other].Worker, p.Worker)
			}
			union.set(i)
			count++
		}
	}
	if missing := unseen(seen); len(missing) > 0 {
		return bad("no part of worker(s) %v of %d", missing, first.NumWorkers)
	}
	bits := union.bytes(n)
	return State{Version: StateVersion, Pack: first.Pack, IndexCRC: first.IndexCRC, ChunksPerGroup: first.ChunksPerGroup,
		Seed: first.Seed, Epoch: first.Epoch, Served: count, Filled: bits, Delivered: slices.Clone(bits)}, nil
}

// restoreTurn is RestoreParts of parts of WorkerPartTurnVersion.
func (s *Server) restoreTurn(parts []WorkerPart) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("loader: %w: %s", ErrState, fmt.Sprintf(format, args...))
	}
	first := parts[0]
	seen := make([]bool, max(first.NumWorkers, 0))
	var last *WorkerPart
	for k := range parts {
		p := &parts[k]
		switch {
		case p.Kind != WorkerPartKind:
			return bad("a part of kind %q, not a DataLoader worker's (%q)", p.Kind, WorkerPartKind)
		case p.Version != WorkerPartTurnVersion:
			return bad("worker %d's part is of version %d, worker %d's of %d", first.Worker, first.Version, p.Worker, p.Version)
		}
		if m := partMismatch(first, *p, seen); m != "" {
			return bad("%s", m)
		}
		switch {
		case p.Batch > 0 && p.State == nil:
			return bad("worker %d's part of batch %d holds no state", p.Worker, p.Batch-1)
		case p.State != nil && (p.State.Epoch != p.Epoch || p.State.Seed != p.Seed):
			return bad("worker %d's part of epoch %d (seed %d) holds a state of epoch %d (seed %d)",
				p.Worker, p.Epoch, p.Seed, p.State.Epoch, p.State.Seed)
		case p.Batch > 0 && last != nil && last.Batch == p.Batch:
			return bad("workers %d and %d both hold batch %d", last.Worker, p.Worker, p.Batch-1)
		}
		seen[p.Worker] = true
		if p.Batch > 0 && (last == nil || p.Batch > last.Batch) {
			last = p
		}
	}
	if missing := unseen(seen); len(missing) > 0 {
		return bad("no part of worker(s) %v of %d", missing, first.NumWorkers)
	}
	n, workers := s.lay.Samples, first.NumWorkers
	var batches uint64
	rot := 0
	st := State{Version: StateVersion, Pack: first.Pack, IndexCRC: first.IndexCRC, ChunksPerGroup: first.ChunksPerGroup,
		Seed: first.Seed, Epoch: first.Epoch, Filled: newBitset(n).bytes(n), Delivered: newBitset(n).bytes(n)}
	if last != nil {
		// The next batch is the next worker's (torchdata resumes its round
		// robin after the worker whose batch it yielded last).
		st, batches = *last.State, last.Batch
		rot = int((uint64(last.Worker+1) + uint64(workers) - batches%uint64(workers)) % uint64(workers))
	}
	if err := s.Restore(st); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.turns.reset(batches, rot, workers)
	return nil
}

// partMismatch says how worker part p differs from first where all of a
// loader's parts must agree (loader, pack, layout, epoch), or that its
// worker is out of range or seen before; "" when none of that.
func partMismatch(first, p WorkerPart, seen []bool) string {
	switch {
	case p.NumWorkers != first.NumWorkers:
		return fmt.Sprintf("parts of loaders of %d and %d workers", first.NumWorkers, p.NumWorkers)
	case p.Worker < 0 || p.Worker >= p.NumWorkers:
		return fmt.Sprintf("a part of worker %d of %d", p.Worker, p.NumWorkers)
	case seen[p.Worker]:
		return fmt.Sprintf("two parts of worker %d", p.Worker)
	case p.Pack != first.Pack || p.IndexCRC != first.IndexCRC:
		return fmt.Sprintf("worker %d's part is of pack %s, worker %d's of %s", first.Worker, first.Pack, p.Worker, p.Pack)
	case p.ChunksPerGroup != first.ChunksPerGroup:
		return fmt.Sprintf("worker %d's part is of a layout of %d chunks per group, worker %d's of %d",
			first.Worker, first.ChunksPerGroup, p.Worker, p.ChunksPerGroup)
	case p.Epoch != first.Epoch || p.Seed != first.Seed:
		return fmt.Sprintf("worker %d's part is of epoch %d (seed %d), worker %d's of epoch %d (seed %d)",
			first.Worker, first.Epoch, first.Seed, p.Worker, p.Epoch, p.Seed)
	}
	return ""
}

// unseen lists the workers whose part is missing from seen.
func unseen(seen []bool) []int {
	var missing []int
	for w, ok := range seen {
		if !ok {
			missing = append(missing, w)
		}
	}
	return missing
}
