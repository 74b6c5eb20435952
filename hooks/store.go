// Package hooks is the runtime store behind pyfastensor's saved-tensor
// hooks: it keeps the bytes of offloaded activations in slots, writes them
// asynchronously, reads them back on demand or ahead of time, and frees
// them when the Python side lets go.
//
// A Store has one tier: "ssd" (one unlinked spill file in a directory,
// written through gds engines) or "host" (Go-allocated memory). Both serve
// the same API:
//
//	id, _ := s.Put(p)        // async write; p must stay valid until Wait(id)
//	id, _ = s.PutIn(acct, p) // the same, counted in an account too (NewAccount)
//	_ = s.Wait(id)           // write done (or failed: ENOSPC is reported here)
//	_ = s.Prefetch(id, nil)  // optional: start reading ahead
//	_ = s.Get(id, dst)       // read into dst (from the prefetch if any)
//	_ = s.Free(id)
//
// The package knows byte extents and engines, not tensors.
package hooks

import (
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// SlotID names one slot of a store. IDs are never reused within a store.
type SlotID uint64

// Config says how to open a store. The zero value of a field means its
// default.
type Config struct {
	// Tier is "ssd" (default) or "host".
	Tier string
	// Dir is the spill directory of the ssd tier. Default: os.TempDir().
	Dir string
	// Engine is the gds engine of the spill file. Default: the choice of
	// transfer.Default for Dir (direct for slots of
	// transfer.DirectThreshold and up where the directory's probe says
	// O_DIRECT works, else posix). Ignored when Picker is set.
	Engine string
	// Picker chooses the engine per transfer (an adaptive dictionary).
	Picker Picker
	// Workers is the number of goroutines running writes and prefetches.
	// Default: the number of CPUs, at least 2.
	Workers int
	// Options tune the engines.
	Options gds.Options
}

// slot is one stored byte string.
type slot struct {
	n       int64
	ext     extent
	acct    *counters     // the account its transfers also count in, or nil
	written chan struct{} // closed when the write finished, ok or not
	// Set before written is closed, read after.
	werr    error
	wdur    time.Duration
	wengine string
	// Guarded by Store.mu.
	pf      *fetch
	rdur    time.Duration
	rengine string
}

// fetch is a read started ahead of Get.
type fetch struct {
	buf    []byte
	owned  bool          // buf is Go memory, not the caller's
	queued bool          // guarded by Store.mu
	done   chan struct{} // closed when the read finished
	err    error         // set before done is closed
}

// Store keeps slots in one tier. All methods are safe for concurrent use,
// except that Get, Prefetch and Free of the same slot must not overlap.
type Store struct {
	be      backend
	q       *queue
	workers sync.WaitGroup

	mu     sync.Mutex
	slots  map[SlotID]*slot
	next   SlotID
	done   []SlotID // writes finished since the last Completed
	closed bool
	c      counters
	// accounts are counters of their own for the slots put in them
	// (PutIn), for several users of one store; ids from 1.
	accounts []*counters
}

// Open creates a store. For the ssd tier it creates the unlinked spill file
// in cfg.Dir, or fails with an error wrapping ErrSpillDir that names the
// directory.
func Open(cfg Config) (*Store, error) {
	var be backend
	switch cfg.Tier {
	case "host":
		be = &memTier{}
	case "ssd", "":
		dir := cfg.Dir
		if dir == "" {
			dir = defaultDir()
		}
		pick := func() Picker {
			if cfg.Picker != nil {
				return cfg.Picker
			}
			if cfg.Engine != "" {
				return FixedPicker{transfer.Fixed(cfg.Engine)}
			}
			return newDefaultPicker(dir)
		}
		sf, err := openSpill(dir, pick, cfg.Options)
		if err != nil {
			return nil, err
		}
		be = sf
	default:
		return nil, fmt.Errorf("%w: tier %q (expected \"ssd\" or \"host\")", gds.ErrInvalid, cfg.Tier)
	}
	s := &Store{be: be, q: newQueue(), slots: map[SlotID]*slot{}}
	s.c = newCounters()
	n := cfg.Workers
	if n <= 0 {
		n = max(runtime.NumCPU(), 2)
	}
	for range n {
		s.workers.Add(1)
		go s.work()
	}
	return s, nil
}

func (s *Store) work() {
	defer s.workers.Done()
	for {
		job, ok := s.q.pop()
		if !ok {
			return
		}
		job()
	}
}

// Describe says what serves the store.
func (s *Store) Describe() Description { return s.be.describe() }

// Put stores p in a new slot and returns its id at once; the write runs on
// the store's pool.
//
// Memory: p is read until the write finishes; the caller keeps it valid and
// unchanged until Wait or Poll reports the slot done (or Free returns).
func (s *Store) Put(p []byte) (SlotID, error) { return s.PutIn(0, p) }

// PutIn is Put with the slot's transfers (its write, prefetch, gets)
// counted in account acct as well as in the store's totals; account 0 is
// none. An unknown account is an error.
func (s *Store) PutIn(acct Account, p []byte) (SlotID, error) {
	n := int64(len(p))
	ext, err := s.be.alloc(n)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.be.release(ext)
		return 0, ErrClosed
	}
	var ac *counters
	if acct != 0 {
		if int(acct) > len(s.accounts) {
			s.mu.Unlock()
			s.be.release(ext)
			return 0, fmt.Errorf("%w: account %d (the store has %d)", gds.ErrInvalid, acct, len(s.accounts))
		}
		ac = s.accounts[acct-1]
	}
	s.next++
	id := s.next
	sl := &slot{n: n, ext: ext, acct: ac, written: make(chan struct{})}
	s.slots[id] = sl
	s.count(sl, func(c *counters) { c.puts++ })
	s.mu.Unlock()
	s.q.push(false, func() { s.runWrite(id, sl, p) })
	return id, nil
}

func (s *Store) runWrite(id SlotID, sl *slot, p []byte) {
	t := time.Now()
	eng, err := guard(func() (string, error) { return s.be.write(sl.ext, p) })
	d := time.Since(t)
	if err != nil {
		err = fmt.Errorf("slot %d (%d bytes): %w", id, sl.n, err)
	}
	s.mu.Lock()
	sl.werr, sl.wdur, sl.wengine = err, d, eng
	s.count(sl, func(c *counters) { c.wrote(sl.n, d, eng, err) })
	s.done = append(s.done, id)
	close(sl.written)
	// A prefetch asked for before the write finished starts now.
	pf := sl.pf
	start := pf != nil && !pf.queued
	if start {
		pf.queued = true
	}
	s.mu.Unlock()
	if start {
		s.q.push(true, func() { s.runRead(sl, pf) })
	}
}

// guard runs a transfer on a pool goroutine under the one panic policy
// (gds.Recover): a panic becomes the transfer's error.
func guard(fn func() (string, error)) (eng string, err error) {
	defer gds.Recover(&err)
	return fn()
}

// lookup returns the slot behind id.
func (s *Store) lookup(id SlotID) (*slot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	sl, ok := s.slots[id]
	if !ok {
		return nil, fmt.Errorf("%w: %d", ErrUnknownSlot, id)
	}
	return sl, nil
}

// Wait blocks until the slot's write finished and returns its error (one
// wrapping gds.ErrNoSpace when the spill filesystem was full).
func (s *Store) Wait(id SlotID) error {
	sl, err := s.lookup(id)
	if err != nil {
		return err
	}
	<-sl.written
	return sl.werr
}

// Poll reports whether the slot's write finished, and its error if so.
func (s *Store) Poll(id SlotID) (bool, error) {
	sl, err := s.lookup(id)
	if err != nil {
		return false, err
	}
	select {
	case <-sl.written:
		return true, sl.werr
	default:
		return false, nil
	}
}

// Completed returns up to max ids whose writes finished (well or not)
// since the last call, oldest first. The caller then Polls each for its
// outcome. Ids of slots freed meanwhile may appear.
func (s *Store) Completed(max int) []SlotID {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := min(max, len(s.done))
	out := append([]SlotID(nil), s.done[:k]...)
	s.done = append(s.done[:0], s.done[k:]...)
	return out
}

// Free releases a slot. It waits for the slot's write and any prefetch in
// flight, so the caller's memory of Put may be dropped once Free returns.
func (s *Store) Free(id SlotID) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	sl, ok := s.slots[id]
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("%w: %d", ErrUnknownSlot, id)
	}
	delete(s.slots, id)
	s.mu.Unlock()
	s.settle(sl)
	s.be.release(sl.ext)
	return nil
}

// settle waits for a slot's write and prefetch to finish and drops the
// prefetch.
func (s *Store) settle(sl *slot) {
	<-sl.written
	s.mu.Lock()
	pf := sl.pf
	sl.pf = nil
	if pf != nil {
		s.count(sl, func(c *counters) { c.prefetchBytes -= sl.n })
	}
	s.mu.Unlock()
	if pf != nil {
		<-pf.done
	}
}

// Close waits for every write and read in flight, frees every slot and
// closes the spill file (which vanishes: it has no name). Closing twice
// returns ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.closed = true
	live := s.slots
	s.slots = nil
	s.mu.Unlock()
	s.q.close()
	s.workers.Wait()
	for _, sl := range live {
		s.settle(sl)
		s.be.release(sl.ext)
	}
	return s.be.close()
}
