package loader

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSampleClassBoundsTheSlack(t *testing.T) {
	require.Equal(t, 1000, sampleClass(1000), "small: its own size")
	require.Equal(t, 102400, sampleClass(102400), "100 KB is a class")
	for _, n := range []int{sampleBufMin, sampleBufMin + 1, 100_001, 1<<20 - 1, 1 << 20, 3<<20 + 17} {
		c := sampleClass(n)
		require.GreaterOrEqual(t, c, n)
		require.LessOrEqual(t, c-n, n/16, "n %d", n)
		require.Equal(t, c, sampleClass(c), "a class is its own class")
	}
}

func TestSamplePoolReusesWithinItsLimit(t *testing.T) {
	p := newSamplePool(3 * 102400)
	a := p.get(100_000)
	require.Len(t, a, 100_000)
	require.Equal(t, sampleClass(100_000), cap(a))
	p.put(a)
	b := p.get(99_000) // the same class
	require.Same(t, &a[0], &b[0], "reused")
	require.Len(t, b, 99_000)

	bufs := [][]byte{b, p.get(100_000), p.get(100_000), p.get(100_000)}
	for _, x := range bufs {
		p.put(x)
	}
	require.EqualValues(t, 3*102400, p.bytes, "the fourth left to the collector")
	p.put(make([]byte, 100_000))             // not of a class: never kept
	p.put(make([]byte, 100, sampleBufMin/2)) // small
	require.EqualValues(t, 3*102400, p.bytes)
	require.Len(t, p.idle, 1)
	p.get(100_000)
	idle, peak := p.usage()
	require.EqualValues(t, 2*102400, idle)
	require.EqualValues(t, 3*102400, peak, "the most held at once")
}

// A requester that copied a batch out releases it, and the next reads'
// samples reuse that memory; a batch not released is never written over.
func TestServerReusesReleasedSamples(t *testing.T) {
	const n = 1200
	ds, p := newPack(t, datasetOpts{n: n, classes: 4, maxSize: 40 << 10, fixedSize: true, seed: 48}, 16)
	s, err := NewServer(p, ServerOptions{Budget: dataBytes(p) / 4, Seed: 2, Overflow: DefaultOverflow, NoReadAhead: true}) // reads in the requests: the reuse counted is not timing's
	require.NoError(t, err)
	reqs := perm(n, 9)
	released := map[*byte]bool{}
	reused := 0
	var all, kept []Sample
	for lo := 0; lo < n; lo += 50 {
		got, err := s.GetBatch(reqs[lo : lo+50])
		require.NoError(t, err)
		for _, smp := range got {
			if released[&smp.Data[0]] {
				reused++
			}
			require.Equal(t, ds.data[smp.Source], smp.Data, "sample at position %d", smp.Position)
		}
		all = append(all, got...)
		if lo%100 != 0 {
			kept = append(kept, got...) // held by its requester
			continue
		}
		s.Release(got) // copied out (compared): the server may reuse their memory
		for _, smp := range got {
			released[&smp.Data[0]] = true
		}
	}
	requireExactlyOnce(t, n, all)
	for _, smp := range kept {
		require.Equal(t, ds.data[smp.Source], smp.Data, "a sample not released, at position %d", smp.Position)
	}
	t.Logf("%d of %d samples in memory released before", reused, n)
	require.Greater(t, reused, n/10)
	st := s.Stats()
	idle, peak := s.mem.usage()
	require.Equal(t, idle, st.IdleSampleBytes, "stats report the pool's idle bytes")
	require.Equal(t, peak, st.PeakIdleSampleBytes)
	require.Positive(t, st.PeakIdleSampleBytes, "released samples were held for reuse")
	require.GreaterOrEqual(t, st.PeakIdleSampleBytes, st.IdleSampleBytes)
	require.LessOrEqual(t, st.PeakIdleSampleBytes, s.mem.limit)
}
