package loader

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// workerParts returns the parts of numWorkers workers of a loader whose
// batch k was fetched by worker k % numWorkers, each part the positions of
// its worker's batches among batches, over server s's head.
func workerParts(s *Server, numWorkers int, batches [][]Sample) []WorkerPart {
	n := s.Len()
	bits := make([]bitset, numWorkers)
	for w := range bits {
		bits[w] = newBitset(n)
	}
	for k, b := range batches {
		for _, smp := range b {
			bits[k%numWorkers].set(smp.Position)
		}
	}
	parts := make([]WorkerPart, numWorkers)
	for w := range parts {
		parts[w] = WorkerPart{Kind: WorkerPartKind, Version: WorkerPartVersion, StateHead: s.Head(), Worker: w,
			NumWorkers: numWorkers, Delivered: bits[w].bytes(n)}
	}
	return parts
}

// The union of the workers' parts of the batches consumed, restored into a
// new server, serves the requests not yet made with exactly the samples
// those batches did not deliver, whatever the batches prefetched past
// them, at every cut, budget and overflow.
func TestRestorePartsResumesExactly(t *testing.T) {
	const n, batch, workers, prefetch = 150, 9, 2, 4
	ds, p := newPack(t, datasetOpts{n: n, classes: 3, maxSize: 400, seed: 61}, 7)
	reqs := perm(n, 6)
	var batches [][]int
	for lo := 0; lo < n; lo += batch {
		batches = append(batches, reqs[lo:min(lo+batch, n)])
	}
	for k, budget := range []int64{minBudget(p), (minBudget(p) + maxBudget(p)) / 3, maxBudget(p)} {
		over := []float64{0, DefaultOverflow, DefaultOverflow}[k]
		for _, cut := range []int{0, 1, 2, len(batches) / 2, len(batches) - 1, len(batches)} {
			a, err := NewServer(p, ServerOptions{Budget: budget, Seed: 8, Overflow: over})
			require.NoError(t, err)
			require.NoError(t, a.SetEpoch(5))
			var got [][]Sample // the consumed batches, and those prefetched past them
			for _, b := range batches[:min(cut+prefetch, len(batches))] {
				got = append(got, serveAll(t, a, ds, b, len(b)))
			}
			parts := workerParts(a, workers, got[:cut])
			parts[0], parts[1] = parts[1], parts[0] // any order

			blob, err := json.Marshal(parts)
			require.NoError(t, err)
			var parts2 []WorkerPart
			require.NoError(t, json.Unmarshal(blob, &parts2))
			p2, err := OpenPack(p.Dir)
			require.NoError(t, err)
			b, err := NewServer(p2, ServerOptions{Budget: budget, Seed: 999, Overflow: over}) // the parts' seed wins
			require.NoError(t, err)
			require.NoError(t, b.RestoreParts(parts2))
			require.Equal(t, uint64(5), b.Epoch())
			require.Equal(t, uint64(8), b.Head().Seed)

			var all []Sample
			for _, g := range got[:cut] {
				all = append(all, g...)
			}
			for _, rest := range batches[cut:] {
				all = append(all, serveAll(t, b, ds, rest, len(rest))...)
			}
			requireExactlyOnce(t, n, all)
			_, err = b.Get(reqs[0])
			require.ErrorIs(t, err, ErrEpochDone, "budget %d, cut %d", budget, cut)
		}
	}
}

func TestRestorePartsRefusals(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 37, classes: 2, maxSize: 200, seed: 62}, 5)
	budget := (minBudget(p) + maxBudget(p)) / 2
	a := newServer(t, p, budget, 1)
	reqs := perm(37, 1)
	got := [][]Sample{serveAll(t, a, ds, reqs[:6], 6), serveAll(t, a, ds, reqs[6:12], 6), serveAll(t, a, ds, reqs[12:18], 6)}
	parts := workerParts(a, 2, got)
	_, other := newPack(t, datasetOpts{n: 37, classes: 2, maxSize: 200, seed: 63}, 5)

	for _, tc := range []struct {
		name, want string
		server     *Server
		change     func(ps []WorkerPart) []WorkerPart
	}{
		{"no parts", "no DataLoader worker's part", nil, func([]WorkerPart) []WorkerPart { return nil }},
		{"a part missing", "no part of worker(s) [1] of 2", nil, func(ps []WorkerPart) []WorkerPart { return ps[:1] }},
		{"a worker twice", "two parts of worker 0", nil, func(ps []WorkerPart) []WorkerPart { return []WorkerPart{ps[0], ps[0]} }},
		{"another epoch", "worker 0's part is of epoch 0 (seed 1), worker 1's of epoch 3", nil, func(ps []WorkerPart) []WorkerPart {
			ps[1].Epoch = 3
			return ps
		}},
		{"another seed", "worker 1's of epoch 0 (seed 2)", nil, func(ps []WorkerPart) []WorkerPart {
			ps[1].Seed = 2
			return ps
		}},
		{"another loader", "parts of loaders of 2 and 3 workers", nil, func(ps []WorkerPart) []WorkerPart {
			ps[1].NumWorkers = 3
			return ps
		}},
		{"parts of two packs", "worker 0's part is of pack", nil, func(ps []WorkerPart) []WorkerPart {
			ps[1].Pack = "00"
			return ps
		}},
		{"parts of two layouts", "worker 0's part is of a layout of", nil, func(ps []WorkerPart) []WorkerPart {
			ps[1].ChunksPerGroup++
			return ps
		}},
		{"not a worker's part", `a part of kind "main"`, nil, func(ps []WorkerPart) []WorkerPart {
			ps[0].Kind = "main"
			return ps
		}},
		{"a newer version", "is of version 2", nil, func(ps []WorkerPart) []WorkerPart {
			ps[0].Version = 2
			return ps
		}},
		{"a position in two parts", "delivered by both worker 0 and worker 1", nil, func(ps []WorkerPart) []WorkerPart {
			ps[1].Delivered = ps[0].Delivered
			return ps
		}},
		{"a short bitmap", "bitmap of 4 bytes for 37 samples", nil, func(ps []WorkerPart) []WorkerPart {
			ps[1].Delivered = ps[1].Delivered[:4]
			return ps
		}},
		{"the server's pack differs", "the state is of pack", newServer(t, other, budget, 1), func(ps []WorkerPart) []WorkerPart { return ps }},
		{"the server's layout differs", "this server's budget of", newServer(t, p, maxBudget(p), 1), func(ps []WorkerPart) []WorkerPart { return ps }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.server
			if s == nil {
				s = newServer(t, p, budget, 1)
			}
			ps := make([]WorkerPart, len(parts))
			copy(ps, parts)
			err := s.RestoreParts(tc.change(ps))
			require.ErrorIs(t, err, ErrState)
			require.ErrorContains(t, err, tc.want)
			require.Zero(t, s.Stats().Served, "a refused restore leaves the server as it was")
		})
	}
}

// restore sends a LocalRestore of part, waiting wait, and returns the
// answer's status and payload.
func (lc *localClient) restore(part WorkerPart, wait time.Duration) (int32, string) {
	lc.t.Helper()
	blob, err := json.Marshal(part)
	require.NoError(lc.t, err)
	st, _, _, out := lc.do(LocalRestore, 0, uint64(wait/time.Millisecond), blob, -1)
	return st, string(out)
}

// Workers resume through the endpoint: each sends its part and waits
// until every worker's came; the server then holds their union, and the
// workers' requests for the rest of the epoch deliver every other sample
// once. Each batch's answer says its epoch; the hello gives a worker the
// head of its part.
func TestLocalRestoreFromEveryWorkersPart(t *testing.T) {
	const n = 60
	ds, p := newPack(t, datasetOpts{n: n, classes: 3, maxSize: 300, seed: 64}, 6)
	a := newServer(t, p, minBudget(p), 3)
	require.NoError(t, a.SetEpoch(2))
	reqs := perm(n, 7)
	consumed := [][]Sample{serveAll(t, a, ds, reqs[:10], 10), serveAll(t, a, ds, reqs[10:20], 10), serveAll(t, a, ds, reqs[20:30], 10)}
	serveAll(t, a, ds, reqs[30:40], 10) // prefetched, not consumed
	parts := workerParts(a, 3, consumed)

	p2, err := OpenPack(p.Dir)
	require.NoError(t, err)
	b := newServer(t, p2, minBudget(p), 11)
	l := serveLocal(t, b)
	hello := dialLocal(t, l.Addr())
	st, _, _, out := hello.do(LocalHello, 0, 0, nil, -1)
	require.Zero(t, st)
	var info LocalHelloInfo
	require.NoError(t, json.Unmarshal(out, &info))
	require.Equal(t, &WorkerPart{Kind: WorkerPartKind, Version: WorkerPartTurnVersion, StateHead: b.Head()}, info.Part)
	require.Equal(t, parts[0].Pack, info.Part.Pack)

	clients := make([]*localClient, 3)
	for w := range clients {
		clients[w] = dialLocal(t, l.Addr())
	}
	var wg sync.WaitGroup
	answers := make([]string, 3)
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, msg := clients[w].restore(parts[w], 10*time.Second)
			answers[w] = fmt.Sprint(st, msg)
		}()
	}
	wg.Wait()
	require.Equal(t, []string{"0", "0", "0"}, answers)
	require.Equal(t, uint64(2), b.Epoch())
	require.EqualValues(t, 30, b.Stats().Served)

	var all []Sample
	for _, c := range consumed {
		all = append(all, c...)
	}
	for lo := 30; lo < n; lo += 10 {
		c := clients[(lo/10)%3]
		ticket, meta := c.get(reqs[lo : lo+10])
		data := c.take(ticket, meta, 0)
		for _, m := range meta {
			require.Equal(t, ds.data[m[1]], data[:m[3]])
			all = append(all, Sample{Position: int(m[0])})
			data = data[m[3]:]
		}
	}
	requireExactlyOnce(t, n, all)

	// A batch's answer ends with its epoch.
	require.NoError(t, b.SetEpoch(9))
	p8 := make([]byte, 8)
	binary.LittleEndian.PutUint64(p8, uint64(reqs[0]))
	st, _, _, out = clients[0].do(LocalGet, 1, 0, p8, -1)
	require.Zero(t, st)
	require.Len(t, out, 8*LocalMetaFields+8)
	require.EqualValues(t, 9, binary.LittleEndian.Uint64(out[8*LocalMetaFields:]))
}

// A worker whose peers' parts do not come in time fails, naming them, and
// leaves the server as it was; a part that does not fit the round fails
// every worker waiting in it; a worker whose connection closes while it
// waits takes its part back, and its round goes with its last part.
func TestLocalRestoreRefusals(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 40, classes: 2, maxSize: 200, seed: 65}, 5)
	a := newServer(t, p, minBudget(p), 3)
	reqs := perm(40, 8)
	consumed := [][]Sample{serveAll(t, a, ds, reqs[:8], 8), serveAll(t, a, ds, reqs[8:16], 8), serveAll(t, a, ds, reqs[16:24], 8)}
	parts := workerParts(a, 3, consumed)
	b := newServer(t, p, minBudget(p), 3)
	l := serveLocal(t, b)

	t.Run("a part missing", func(t *testing.T) {
		c0, c2 := dialLocal(t, l.Addr()), dialLocal(t, l.Addr())
		done := make(chan string)
		go func() {
			st, msg := c2.restore(parts[2], 10*time.Second)
			done <- fmt.Sprint(st, " ", msg)
		}()
		require.Eventually(t, func() bool { return roundParts(l) == 1 }, 5*time.Second, time.Millisecond)
		st, msg := c0.restore(parts[0], 50*time.Millisecond)
		require.EqualValues(t, 7, st)
		require.Contains(t, msg, "worker 0 of 3 waited 50ms for the parts of worker(s) [1]")
		require.Contains(t, <-done, "7 ")
		require.Zero(t, b.Stats().Served)
		require.Equal(t, 0, roundParts(l))
	})
	t.Run("another loader's part", func(t *testing.T) {
		c0, c1 := dialLocal(t, l.Addr()), dialLocal(t, l.Addr())
		done := make(chan string)
		go func() {
			st, msg := c0.restore(parts[0], 10*time.Second)
			done <- fmt.Sprint(st, " ", msg)
		}()
		require.Eventually(t, func() bool { return roundParts(l) == 1 }, 5*time.Second, time.Millisecond)
		other := parts[1]
		other.NumWorkers = 4
		st, msg := c1.restore(other, 10*time.Second)
		require.EqualValues(t, 7, st)
		require.Contains(t, msg, "a part of a loader of 4 workers came while the parts of one of 3")
		require.Contains(t, <-done, "a part of a loader of 4 workers")
	})
	t.Run("parts of other epochs", func(t *testing.T) {
		var wg sync.WaitGroup
		answers := make([]string, 3)
		for w := range parts {
			c := dialLocal(t, l.Addr())
			part := parts[w]
			if w == 2 {
				part.Epoch = 1
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, msg := c.restore(part, 10*time.Second)
				answers[w] = fmt.Sprint(st, " ", msg)
			}()
		}
		wg.Wait()
		for _, a := range answers {
			require.Contains(t, a, "worker 0's part is of epoch 0 (seed 3), worker 2's of epoch 1")
		}
		require.Zero(t, b.Stats().Served)
	})
	t.Run("a worker gone while it waits", func(t *testing.T) {
		gone := dialLocal(t, l.Addr())
		stale := parts[0]
		stale.NumWorkers = 4 // of an earlier loader, shut down while it resumed
		blob, err := json.Marshal(stale)
		require.NoError(t, err)
		frame := make([]byte, 20+len(blob))
		binary.LittleEndian.PutUint32(frame, uint32(16+len(blob)))
		binary.LittleEndian.PutUint32(frame[4:], LocalRestore)
		binary.LittleEndian.PutUint64(frame[12:], 10_000)
		copy(frame[20:], blob)
		_, err = gone.c.Write(frame)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return roundParts(l) == 1 }, 5*time.Second, time.Millisecond)
		require.NoError(t, gone.c.Close())
		require.Eventually(t, func() bool { return roundParts(l) == 0 }, 5*time.Second, time.Millisecond)

		var wg sync.WaitGroup
		answers := make([]string, 3)
		for w := range parts {
			c := dialLocal(t, l.Addr())
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, msg := c.restore(parts[w], 10*time.Second)
				answers[w] = fmt.Sprint(st, msg)
			}()
		}
		wg.Wait()
		require.Equal(t, []string{"0", "0", "0"}, answers)
		require.EqualValues(t, 24, b.Stats().Served)
	})
}

// roundParts is the number of parts of the restore being collected.
func roundParts(l *Local) int {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if l.round == nil {
		return 0
	}
	return len(l.round.parts)
}
