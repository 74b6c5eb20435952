package loader

// Owner-side prefetch (the paper's section 3.4), for loader/dist: an owner
// answering a remote node's miss also sends samples for that node's
// upcoming requests, but only those already in memory (opportunistic: no
// chunk is read for a prefetch) and only within the bytes the requester
// can hold.

// Owns reports whether this server owns the abstract chunk position i
// maps to (Layout.Owned).
func (s *Server) Owns(i int) bool {
	if i < 0 || i >= s.lay.Samples {
		return false
	}
	return s.owned[s.lay.group(i/s.lay.ChunkSize)]
}

// Prefetch delivers, for each position of window in order, the sample a
// request for it would get now if that sample is in memory (landed, not
// damaged): a spare of its slot first, else the slot's sample; positions
// whose next sample is not in memory, outside the pack, of an abstract
// chunk another server owns, or whose slot has no undelivered sample left
// are skipped, and so is one whose bytes would take the total past limit.
// Each sample returned is delivered (invalidated, as by GetBatch: the
// requester must serve it to a request of its slot). Each entry is one
// request: a slot listed twice may give two samples. Like GetBatch, a
// request that leaves its abstract chunk empty starts the read-ahead.
func (s *Server) Prefetch(window []int, limit int64) []Sample {
	s.mu.Lock()
	if s.closed || limit <= 0 {
		s.mu.Unlock()
		return nil
	}
	var out []Sample
	var ahead []*fill
	var used int64
	n := s.lay.ChunkSize
	for _, i := range window {
		if !s.Owns(i) {
			continue
		}
		g := s.lay.group(i / n)
		x := g*n + i%n
		size, ok := s.ready(x)
		if !ok || used+size > limit {
			continue
		}
		t := s.assign(i)
		if !t.ready || t.err != nil { // ready said it is in memory
			continue
		}
		used += size
		e := &s.ix.Samples[t.pos]
		out = append(out, Sample{Request: i, Position: t.pos, Source: e.Source, Label: e.Label, Epoch: s.epoch, Data: t.data})
		if f := s.readAhead(g, i%n); f != nil {
			ahead = append(ahead, f)
		}
	}
	s.mu.Unlock()
	if len(ahead) > 0 {
		go s.read(ahead)
	}
	return out
}

// ready reports whether the sample a request for slot x would get now is
// in memory, and its bytes.
func (s *Server) ready(x int) (int64, bool) {
	if s.left[x] == 0 {
		return 0, false
	}
	if sp := s.spares[x]; len(sp) > 0 {
		return int64(len(sp[0].data)), sp[0].ready
	}
	f := s.slotFill[x]
	if s.slotChunk[x] < 0 || f == nil || !f.landed || f.err != nil {
		return 0, false
	}
	pos := s.slotChunk[x]*s.lay.ChunkSize + x%s.lay.ChunkSize
	if f.bad[pos] != nil {
		return 0, false
	}
	return int64(len(s.slotData[x])), true
}
