package loader

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPlanLayoutBounds(t *testing.T) {
	_, p := newPack(t, datasetOpts{n: 50, classes: 2, maxSize: 9000, seed: 31}, 6)
	ix := p.Index
	var maxChunk int64
	for _, c := range ix.Chunks {
		maxChunk = max(maxChunk, c.Length)
	}
	least := slotBytes(ix, len(ix.Chunks)) + maxChunk

	_, err := PlanLayout(ix, least-1)
	require.ErrorIs(t, err, ErrBudget)
	require.ErrorContains(t, err, fmt.Sprintf("a budget of %d bytes is below the %d bytes", least-1, least))
	require.ErrorContains(t, err, fmt.Sprintf("the largest chunk file, %d bytes", maxChunk))
	_, err = NewServer(p, ServerOptions{Budget: 1000})
	require.ErrorIs(t, err, ErrBudget)
	require.ErrorContains(t, err, "a budget of 1000 bytes")

	l, err := PlanLayout(ix, least)
	require.NoError(t, err)
	require.Equal(t, len(ix.Chunks), l.ChunksPerGroup, "the least budget: one abstract chunk")
	require.Equal(t, 1, l.AbstractChunks)
	require.Equal(t, least, l.MinBudget)
	require.Equal(t, []int{0}, l.Owned)

	l, err = PlanLayout(ix, maxBudget(p))
	require.NoError(t, err)
	require.Equal(t, 1, l.ChunksPerGroup, "room for every chunk: one abstract chunk each")
	require.Equal(t, len(ix.Chunks), l.AbstractChunks)
	require.Len(t, l.Owned, len(ix.Chunks))

	// Every budget in between gets a layout within it, with the least
	// group size that fits (slotBytes is not monotone in G in general,
	// but the search's answer must fit and its predecessor must not).
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		b := least + r.Int64N(maxBudget(p)-least+1)
		l, err := PlanLayout(ix, b)
		require.NoError(t, err)
		require.LessOrEqual(t, l.SlotBytes+l.MaxChunkBytes, b)
		require.Equal(t, b-l.SlotBytes, l.ReadBytes)
		if l.ChunksPerGroup > 1 {
			require.Greater(t, slotBytes(ix, l.ChunksPerGroup-1)+maxChunk, b, "budget %d, G %d", b, l.ChunksPerGroup)
		}
	}
}
