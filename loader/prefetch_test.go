package loader

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// Rank and World split the abstract chunks among the servers of a
// cluster: disjoint, covering them all (g % World == Rank), the layout
// planned for the cluster's memory; a request for another's is refused.
func TestShareSplitsAbstractChunks(t *testing.T) {
	_, p := newPack(t, datasetOpts{n: 120, classes: 3, maxSize: 200, seed: 71}, 4)
	budget := minBudget(p) * 2
	one, err := NewServer(p, ServerOptions{Budget: 3 * budget})
	require.NoError(t, err)
	owner := map[int]int{}
	for r := range 3 {
		s, err := NewServer(p, ServerOptions{Budget: budget, Rank: r, World: 3})
		require.NoError(t, err)
		lay := s.Layout()
		require.Equal(t, one.Layout().ChunksPerGroup, lay.ChunksPerGroup, "planned for the cluster's memory")
		for _, g := range lay.Owned {
			require.Equal(t, r, g%3)
			_, dup := owner[g]
			require.False(t, dup, "abstract chunk %d owned twice", g)
			owner[g] = r
		}
		for i := range 120 {
			g := lay.group(i / lay.ChunkSize)
			require.Equal(t, g%3 == r, s.Owns(i), "position %d", i)
			if g%3 != r {
				_, err := s.Get(i)
				require.ErrorIs(t, err, ErrNotOwned)
				require.ErrorContains(t, err, "maps to abstract chunk")
				break
			}
		}
	}
	require.Len(t, owner, one.Layout().AbstractChunks)
	_, err = NewServer(p, ServerOptions{Budget: budget, Rank: 3, World: 3})
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "rank 3 of a world of 3")
}

// In a cluster the overflow share gives way until every server owns an
// abstract chunk, where the budget without it allows that many.
func TestShareGivesEveryServerAnAbstractChunk(t *testing.T) {
	_, p := newPack(t, datasetOpts{n: 480, classes: 3, maxSize: 2000, seed: 73}, 8)
	budget := minBudget(p) // per node
	none, err := NewServer(p, ServerOptions{Budget: 4 * budget})
	require.NoError(t, err)
	require.GreaterOrEqual(t, none.Layout().AbstractChunks, 4, "the budget without overflow allows it")
	one, err := NewServer(p, ServerOptions{Budget: 4 * budget, Overflow: DefaultOverflow})
	require.NoError(t, err)
	require.Less(t, one.Layout().AbstractChunks, 4, "one node keeps the default's spares")
	for r := range 4 {
		s, err := NewServer(p, ServerOptions{Budget: budget, Overflow: DefaultOverflow, Rank: r, World: 4})
		require.NoError(t, err)
		require.NotEmpty(t, s.Layout().Owned, "rank %d", r)
		require.LessOrEqual(t, s.Layout().OverflowBytes, one.Layout().OverflowBytes)
	}
}

// Prefetch delivers only samples already in memory (reading no chunk),
// within its byte limit, each delivered once: with the requests it
// answered left out, the rest of the epoch delivers every other sample.
func TestPrefetchServesOnlyWhatIsInMemory(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 96, classes: 3, maxSize: 300, seed: 72}, 8)
	s, err := NewServer(p, ServerOptions{Budget: maxBudget(p), NoReadAhead: true})
	require.NoError(t, err)
	reqs := perm(96, 9)
	require.Empty(t, s.Prefetch(reqs, 1<<30), "nothing in memory yet")
	got := serveAll(t, s, ds, reqs[:1], 1)
	reads := s.Stats().ChunkReads

	const limit = 700
	pre := s.Prefetch(reqs[1:], limit)
	require.NotEmpty(t, pre)
	var bytes int
	answered := map[int]bool{}
	for _, smp := range pre {
		bytes += len(smp.Data)
		require.Equal(t, ds.data[smp.Source], smp.Data)
		require.Equal(t, lay(s).group(smp.Request/8), lay(s).group(smp.Position/8), "from the request's abstract chunk")
		require.Equal(t, smp.Request%8, smp.Position%8, "from the request's slot")
		answered[smp.Request] = true
	}
	require.LessOrEqual(t, bytes, limit)
	require.Equal(t, reads, s.Stats().ChunkReads, "a prefetch reads no chunk")
	require.Empty(t, s.Prefetch(reqs[1:], 0))

	var rest []int
	for _, i := range reqs[1:] {
		if !answered[i] {
			rest = append(rest, i)
		}
	}
	got = append(got, pre...)
	got = append(got, serveAll(t, s, ds, rest, 5)...)
	requireExactlyOnce(t, 96, got)
	_, err = s.Get(reqs[0])
	require.True(t, errors.Is(err, ErrEpochDone))
}

func lay(s *Server) *Layout { return &s.lay }
