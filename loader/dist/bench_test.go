package dist

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkClusterEpoch is one epoch of k nodes on loopback, each asking
// for its share in batches of 64 (one DataLoader process each), the pack
// in the page cache: the protocol's own cost per sample.
func BenchmarkClusterEpoch(b *testing.B) {
	const samples, size = 8000, 32
	tp := newTestPack(b, samples, size, 8192, 7)
	for _, k := range []int{1, 2, 4} {
		for _, prefetch := range []bool{false, true} {
			if k == 1 && prefetch {
				continue
			}
			b.Run(fmt.Sprintf("nodes=%d/prefetch=%v", k, prefetch), func(b *testing.B) {
				budget := max(tp.dataBytes()*15/100, tp.minBudget(k))
				nodes := cluster(b, tp, k, budget, Options{RemoteBytes: budget / 10, NoPrefetch: !prefetch})
				seqs := shares(samples, k, 11)
				b.SetBytes(tp.dataBytes())
				b.ResetTimer()
				for e := range b.N {
					for _, n := range nodes {
						require.NoError(b, n.SetEpoch(uint64(e)))
					}
					for r, n := range nodes {
						require.NoError(b, n.SetSequence(uint64(e), seqs[r]))
					}
					got := serveShares(b, nodes, seqs, 64, 1)
					total := 0
					for _, g := range got {
						total += len(g)
					}
					require.Equal(b, samples, total)
				}
			})
		}
	}
}
