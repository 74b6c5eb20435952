package loader

import "sync"

// byteSem bounds the bytes of the chunk reads in flight: acquire waits
// until n more fit under the cap.
type byteSem struct {
	mu   sync.Mutex
	cond sync.Cond
	cap  int64
	used int64
}

func newByteSem(limit int64) *byteSem {
	s := &byteSem{cap: limit}
	s.cond.L = &s.mu
	return s
}

func (s *byteSem) acquire(n int64) {
	s.mu.Lock()
	for s.used+n > s.cap {
		s.cond.Wait()
	}
	s.used += n
	s.mu.Unlock()
}

func (s *byteSem) release(n int64) {
	s.mu.Lock()
	s.used -= n
	s.mu.Unlock()
	s.cond.Broadcast()
}
