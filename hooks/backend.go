package hooks

import (
	"sync"
	"sync/atomic"
)

// backend is where slot bytes live: the spill file (ssd tier) or Go memory
// (host tier). The store serialises nothing for it: alloc, release, write
// and read are called from many goroutines at once, on disjoint extents.
type backend interface {
	// alloc reserves room for n bytes.
	alloc(n int64) (extent, error)
	// release gives an extent back; no transfer on it may be in flight.
	release(e extent)
	// write stores p in e; it returns the engine that moved the bytes.
	write(e extent, p []byte) (string, error)
	// read fills p from e; it returns the engine that moved the bytes.
	read(e extent, p []byte) (string, error)
	// usage reports bytes held, their peak, and the backing size (file
	// length for the spill file).
	usage() (used, peak, size int64)
	// describe says what serves the store.
	describe() Description
	close() error
}

// Description says what serves a store, for the summary and info().
type Description struct {
	Tier string `json:"tier"` // "ssd" or "host"
	Dir  string `json:"dir,omitempty"`
	// Spill is how the spill file was made invisible: "O_TMPFILE",
	// "unlink-after-open", or "" for the host tier.
	Spill    string   `json:"spill,omitempty"`
	FSType   string   `json:"fs_type,omitempty"`
	Engines  []string `json:"engines"`
	Fallback string   `json:"fallback,omitempty"`
}

// memTier is the host tier: each slot is a Go-allocated buffer.
type memTier struct {
	mu         sync.Mutex
	used, peak int64
	next       atomic.Int64
}

var _ backend = (*memTier)(nil)

func (m *memTier) alloc(n int64) (extent, error) {
	m.mu.Lock()
	m.used += n
	m.peak = max(m.peak, m.used)
	m.mu.Unlock()
	return extent{off: m.next.Add(1), size: n, buf: make([]byte, n)}, nil
}

func (m *memTier) release(e extent) {
	m.mu.Lock()
	m.used -= e.size
	m.mu.Unlock()
}

func (m *memTier) write(e extent, p []byte) (string, error) { copy(e.buf, p); return "memory", nil }
func (m *memTier) read(e extent, p []byte) (string, error)  { copy(p, e.buf); return "memory", nil }

func (m *memTier) usage() (int64, int64, int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used, m.peak, m.used
}

func (m *memTier) describe() Description {
	return Description{Tier: "host", Engines: []string{"memory"}}
}

func (m *memTier) close() error { return nil }
