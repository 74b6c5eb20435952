package hooks

import (
	"fmt"
	"maps"
	"os"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
)

// defaultDir is the spill directory when none is given.
func defaultDir() string { return os.TempDir() }

// counters are the store's running totals, or an account's, guarded by
// Store.mu.
type counters struct {
	puts, gets, prefetches, hits, failed int64
	written, readBytes                   int64
	writeTime, readTime, stall           time.Duration
	prefetchBytes, peakPrefetch          int64
	engineBytes                          map[string]int64
}

func newCounters() counters { return counters{engineBytes: map[string]int64{}} }

// Account names counters of their own in a store (NewAccount): the
// transfers of the slots put in it (PutIn), for one of several users of a
// store, each of whom wants its own figures. 0 is no account.
type Account uint64

// NewAccount opens an account: from now on, StatsOf(it) counts the
// transfers of the slots put in it. Accounts last as long as the store.
func (s *Store) NewAccount() (Account, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	c := newCounters()
	s.accounts = append(s.accounts, &c)
	return Account(len(s.accounts)), nil
}

// count applies f to the store's totals and to the account sl was put in.
// The caller holds s.mu.
func (s *Store) count(sl *slot, f func(c *counters)) {
	f(&s.c)
	if sl.acct != nil {
		f(sl.acct)
	}
}

func (c *counters) wrote(n int64, d time.Duration, eng string, err error) {
	if err != nil {
		c.failed++
		return
	}
	c.written += n
	c.writeTime += d
	c.engineBytes[eng] += n
}

func (c *counters) read(n int64, d time.Duration, eng string) {
	c.readBytes += n
	c.readTime += d
}

// Stats are a store's totals since it was opened.
type Stats struct {
	Puts         int64 `json:"puts"`
	Gets         int64 `json:"gets"`
	Prefetches   int64 `json:"prefetches"`
	PrefetchHits int64 `json:"prefetch_hits"` // gets served by a prefetch
	FailedWrites int64 `json:"failed_writes"`
	BytesWritten int64 `json:"bytes_written"`
	BytesRead    int64 `json:"bytes_read"`
	WriteNs      int64 `json:"write_ns"` // summed over writes (they overlap)
	ReadNs       int64 `json:"read_ns"`
	StallNs      int64 `json:"stall_ns"` // time Get waited for I/O
	// StoredBytes is what live slots hold (rounded up to 4 KiB in the
	// spill file); PeakStoredBytes its highest value; FileBytes the spill
	// file's length (or the host tier's memory).
	StoredBytes       int64            `json:"stored_bytes"`
	PeakStoredBytes   int64            `json:"peak_stored_bytes"`
	FileBytes         int64            `json:"file_bytes"`
	PrefetchBytes     int64            `json:"prefetch_bytes"`
	PeakPrefetchBytes int64            `json:"peak_prefetch_bytes"`
	LiveSlots         int              `json:"live_slots"`
	EngineBytes       map[string]int64 `json:"engine_bytes"` // bytes written per engine
	// Fallback says why an engine other than the one asked for serves
	// the spill file (Description.Fallback, as of now: a cuFile failure
	// during the run shows here).
	Fallback string `json:"fallback,omitempty"`
}

// Stats returns the store's totals.
func (s *Store) Stats() Stats {
	st, _ := s.StatsOf(0)
	return st
}

// StatsOf returns account acct's figures (its slots' transfers: puts,
// gets, prefetches, hits, bytes, times, engines, prefetch bytes) beside
// the store's occupancy (stored, peak stored and file bytes, live slots),
// which are the whole store's; account 0 is the store's totals. An unknown
// account is an error.
func (s *Store) StatsOf(acct Account) (Stats, error) {
	used, peak, size := s.be.usage()
	fallback := s.be.describe().Fallback
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &s.c
	if acct != 0 {
		if int(acct) > len(s.accounts) {
			return Stats{}, fmt.Errorf("%w: account %d (the store has %d)", gds.ErrInvalid, acct, len(s.accounts))
		}
		c = s.accounts[acct-1]
	}
	return Stats{
		Puts: c.puts, Gets: c.gets, Prefetches: c.prefetches, PrefetchHits: c.hits,
		FailedWrites: c.failed, BytesWritten: c.written, BytesRead: c.readBytes,
		WriteNs: int64(c.writeTime), ReadNs: int64(c.readTime), StallNs: int64(c.stall),
		StoredBytes: used, PeakStoredBytes: peak, FileBytes: size,
		PrefetchBytes: c.prefetchBytes, PeakPrefetchBytes: c.peakPrefetch,
		LiveSlots: len(s.slots), EngineBytes: maps.Clone(c.engineBytes), Fallback: fallback,
	}, nil
}

// SlotInfo is what the store measured for one slot, for the profiling
// iteration of the scheduler.
type SlotInfo struct {
	Size        int64  `json:"size"`
	Written     bool   `json:"written"`
	Error       string `json:"error,omitempty"`
	WriteNs     int64  `json:"write_ns"`
	ReadNs      int64  `json:"read_ns"` // last read, 0 if never read
	WriteEngine string `json:"write_engine,omitempty"`
	ReadEngine  string `json:"read_engine,omitempty"`
}

// Info returns what the store measured for a slot.
func (s *Store) Info(id SlotID) (SlotInfo, error) {
	sl, err := s.lookup(id)
	if err != nil {
		return SlotInfo{}, err
	}
	info := SlotInfo{Size: sl.n}
	select {
	case <-sl.written:
		info.Written = true
		info.WriteNs, info.WriteEngine = int64(sl.wdur), sl.wengine
		if sl.werr != nil {
			info.Error = sl.werr.Error()
		}
	default:
	}
	s.mu.Lock()
	info.ReadNs, info.ReadEngine = int64(sl.rdur), sl.rengine
	s.mu.Unlock()
	return info, nil
}
