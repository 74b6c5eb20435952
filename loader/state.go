package loader

import (
	"encoding/hex"
	"fmt"
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
	n, size := s.lay.Samples, s.lay.ChunkSize
	filled := newBitset(n)
	for i := range n {
		if !s.unfilled[(i/size)*s.words:].has(i % size) {
			filled.set(i)
		}
	}
	var spares []int
	for x := range s.slotChunk {
		for _, sp := range s.spares[x] {
			spares = append(spares, sp.pos)
		}
	}
	return State{Version: StateVersion, Pack: hex.EncodeToString(s.ix.SpecHash[:]), IndexCRC: s.ix.CRC,
		ChunksPerGroup: s.lay.ChunksPerGroup, Seed: s.seed, Epoch: s.epoch, Draws: s.tie.draws,
		Served: s.nDelivered, Filled: filled.bytes(n), Delivered: s.delivered.bytes(n), Spares: spares}, nil
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
