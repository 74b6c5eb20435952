package dist

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pyfastensor/pyfastensor/loader"
	"github.com/pyfastensor/pyfastensor/loader/dist/distpb"
)

// Every node requests its share of the epoch's permutation, with workers
// racing; the union of what they deliver is every sample once, with its
// bytes, with and without prefetch, for 2 and 3 nodes; a second epoch
// too.
func TestClusterDeliversEachSampleOnce(t *testing.T) {
	tp := newTestPack(t, 480, 8, 400, 1)
	for _, k := range []int{2, 3} {
		for _, noPrefetch := range []bool{false, true} {
			// Three quarters of the data in the cluster: at half, the spares
			// of a random epoch outgrow the overflow share at any G but the
			// widest, one abstract chunk per node (loader's widen).
			budget := max(tp.dataBytes()*3/4/int64(k), tp.minBudget(k))
			nodes := cluster(t, tp, k, budget, Options{RemoteBytes: budget / 5, NoPrefetch: noPrefetch})
			for _, n := range nodes {
				require.GreaterOrEqual(t, len(n.lay.Owned), 2, "%d nodes: each owns abstract chunks", k)
				require.Less(t, n.lay.ChunksPerGroup*n.lay.AbstractChunks, 2*n.lay.Chunks)
				require.Greater(t, n.lay.ChunksPerGroup, 1, "less memory than data: refills")
			}
			for epoch := range uint64(2) {
				seqs := shares(480, k, epoch+uint64(k))
				for r, n := range nodes {
					require.NoError(t, n.SetEpoch(epoch))
					require.NoError(t, n.SetSequence(epoch, seqs[r]))
				}
				got := serveShares(t, nodes, seqs, 16, 2)
				requireExactlyOnce(t, tp, got)
				st := sumStats(nodes)
				require.EqualValues(t, 480, st.LocalRequests+st.RemoteHits+st.RemoteMisses)
				require.Equal(t, st.RemoteMisses, st.ServedRemote, "each miss served by its owner")
				require.Equal(t, st.Prefetched, st.PrefetchSent)
				require.Equal(t, st.Prefetched, st.RemoteHits, "every prefetched sample consumed")
				if noPrefetch {
					require.Zero(t, st.Prefetched)
				} else {
					require.Positive(t, st.Prefetched)
				}
				for _, n := range nodes {
					require.Zero(t, n.Stats().RemoteHeldBytes, "nothing left in remote memory at the epoch's end")
				}
			}
		}
	}
}

// The paper's Table 5: owner-prefetch cuts the requests that miss the
// remote memory (and the calls to owners) by at least half.
func TestPrefetchCutsRemoteMisses(t *testing.T) {
	tp := newTestPack(t, 960, 8, 300, 2)
	for _, k := range []int{2, 4} {
		budget := max(tp.dataBytes()/4/int64(k), tp.minBudget(k))
		run := func(noPrefetch bool) Stats {
			nodes := cluster(t, tp, k, budget, Options{RemoteBytes: budget / 4, NoPrefetch: noPrefetch})
			seqs := shares(960, k, 11)
			for r, n := range nodes {
				require.NoError(t, n.SetSequence(0, seqs[r]))
			}
			requireExactlyOnce(t, tp, serveShares(t, nodes, seqs, 8, 1))
			return sumStats(nodes)
		}
		without, with := run(true), run(false)
		t.Logf("%d nodes: remote misses %d -> %d, remote requests %d -> %d, prefetched %d",
			k, without.RemoteMisses, with.RemoteMisses, without.RemoteRequests, with.RemoteRequests, with.Prefetched)
		require.Zero(t, without.RemoteHits)
		require.LessOrEqual(t, 2*with.RemoteMisses, without.RemoteMisses, "%d nodes", k)
		require.Less(t, with.RemoteRequests, without.RemoteRequests, "%d nodes", k)
	}
}

// The remote memory never holds more than its limit; a limit of zero
// prefetches nothing.
func TestRemoteMemoryLimitHolds(t *testing.T) {
	tp := newTestPack(t, 480, 8, 400, 3)
	budget := max(tp.dataBytes()/4/2, tp.minBudget(2))
	for _, limit := range []int64{0, 1000, 4000} {
		nodes := cluster(t, tp, 2, budget, Options{RemoteBytes: limit})
		seqs := shares(480, 2, 4)
		for r, n := range nodes {
			require.NoError(t, n.SetSequence(0, seqs[r]))
		}
		requireExactlyOnce(t, tp, serveShares(t, nodes, seqs, 8, 2))
		st := sumStats(nodes)
		require.LessOrEqual(t, st.RemotePeakBytes, limit, "limit %d", limit)
		if limit == 0 {
			require.Zero(t, st.Prefetched)
		} else {
			require.Positive(t, st.Prefetched, "limit %d", limit)
			require.Greater(t, st.RemotePeakBytes, limit/4, "limit %d: the memory is used", limit)
		}
	}
}

// A call without the job's token, or with another, is refused with
// Unauthenticated and says why; a node given another token cannot join.
func TestCallsWithoutTheTokenAreRefused(t *testing.T) {
	tp := newTestPack(t, 64, 8, 100, 4)
	budget := tp.minBudget(2) * 2
	n0, addr0 := startNode(t, tp, 0, 2, budget, Options{})
	conn, err := grpc.NewClient(addr0, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	c := distpb.NewBrandClient(conn)
	ctx := context.Background()
	owned := -1
	for i := range 64 {
		if n0.owner(i) == 0 {
			owned = i
			break
		}
	}
	require.GreaterOrEqual(t, owned, 0)
	req := &distpb.FetchRequest{Rank: 1, Positions: []int64{int64(owned)}}
	_, err = c.Fetch(ctx, req)
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	require.ErrorContains(t, err, "node 0 refuses /pyfastensor.loader.dist.Brand/Fetch: the call carries no token")
	_, err = c.Fetch(metadata.AppendToOutgoingContext(ctx, TokenKey, "guess"), req)
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	require.ErrorContains(t, err, "carries another token than this job's")
	require.Zero(t, n0.Server().Stats().Served, "nothing served to a refused call")

	resp, err := c.Fetch(metadata.AppendToOutgoingContext(ctx, TokenKey, testToken), req)
	require.NoError(t, err, "the token lets it in")
	require.Len(t, resp.GetSamples(), 1)

	intruder, _ := startNode(t, tp, 1, 2, budget, Options{Token: "another job"})
	err = intruder.Connect([]string{addr0, "unused"})
	require.ErrorIs(t, err, ErrNodeFailed)
	require.ErrorContains(t, err, "hello to node 0 ("+addr0+") failed")
	require.ErrorContains(t, err, "carries another token")
}

// A node that dies mid-epoch makes the others' requests for its slots
// fail with an error naming it and its address; nothing of the failed
// batch is kept (its local part goes back to the server).
func TestKilledNodeFailsRequestsClearly(t *testing.T) {
	tp := newTestPack(t, 240, 8, 200, 5)
	budget := tp.minBudget(2) + 2*tp.dataBytes() // every chunk its own abstract chunk
	nodes := cluster(t, tp, 2, budget, Options{RemoteBytes: budget / 4})
	seqs := shares(240, 2, 6)
	for r, n := range nodes {
		require.NoError(t, n.SetSequence(0, seqs[r]))
	}
	serveShares(t, nodes, [][]int{seqs[0][:40], seqs[1][:40]}, 8, 1)
	addr1 := nodes[1].ln.Addr().String()
	require.NoError(t, nodes[1].Close())

	local, remote := -1, -1
	nodes[0].mu.Lock()
	for _, i := range seqs[0][40:] {
		_, held := nodes[0].remote[nodes[0].slot(i)]
		if nodes[0].owner(i) == 0 && local < 0 {
			local = i
		} else if nodes[0].owner(i) == 1 && remote < 0 && !held {
			remote = i // not prefetched: a miss
		}
	}
	nodes[0].mu.Unlock()
	require.True(t, local >= 0 && remote >= 0)
	served := nodes[0].Server().Stats().Served
	_, err := nodes[0].GetBatch([]int{local, remote})
	require.ErrorIs(t, err, ErrNodeFailed)
	require.ErrorContains(t, err, "to node 1 ("+addr1+") failed")
	require.Equal(t, served, nodes[0].Server().Stats().Served, "the batch's local sample given back")
	smp, err := nodes[0].GetBatch([]int{local})
	require.NoError(t, err, "the node's own slots still serve")
	require.Len(t, smp, 1)
}

// Every node's state, taken mid-epoch after every node dropped its remote
// memory back to the owners, resumes the whole cluster in new processes
// (new servers, new ports): the two halves deliver every sample once.
func TestClusterResumesFromItsStates(t *testing.T) {
	tp := newTestPack(t, 480, 8, 300, 7)
	const k = 3
	budget := max(tp.dataBytes()/4/k, tp.minBudget(k))
	o := Options{RemoteBytes: budget / 4}
	nodes := cluster(t, tp, k, budget, o)
	seqs := shares(480, k, 8)
	half := make([][]int, k)
	rest := make([][]int, k)
	for r, n := range nodes {
		require.NoError(t, n.SetSequence(0, seqs[r]))
		half[r], rest[r] = seqs[r][:len(seqs[r])/2], seqs[r][len(seqs[r])/2:]
	}
	first := serveShares(t, nodes, half, 8, 1)
	_, err := nodes[0].State()
	if nodes[0].Stats().RemoteHeldBytes > 0 {
		require.ErrorIs(t, err, loader.ErrState, "prefetched samples must be dropped first")
		require.ErrorContains(t, err, "Drop them (on every node) before taking the state")
	} else {
		require.NoError(t, err)
	}
	for _, n := range nodes {
		require.NoError(t, n.Drop())
		require.Zero(t, n.Stats().RemoteHeldBytes)
	}
	states := make([]State, k)
	for r, n := range nodes {
		states[r], err = n.State()
		require.NoError(t, err)
		require.Equal(t, len(half[r]), states[r].Issued)
		require.NoError(t, n.Close())
	}

	again := cluster(t, tp, k, budget, o)
	require.ErrorIs(t, again[0].Restore(states[1]), loader.ErrState)
	for r, n := range again {
		require.NoError(t, n.Restore(states[r]))
		require.NoError(t, n.SetSequence(0, rest[r]))
	}
	second := serveShares(t, again, rest, 8, 2)
	all := make([][]loader.Sample, 0, 2*k)
	requireExactlyOnce(t, tp, append(append(all, first...), second...))
}

// An owner refuses requests of another epoch than its own, saying so.
func TestOwnerRefusesAnotherEpoch(t *testing.T) {
	tp := newTestPack(t, 120, 8, 100, 9)
	nodes := cluster(t, tp, 2, tp.minBudget(2)+2*tp.dataBytes(), Options{})
	require.NoError(t, nodes[1].SetEpoch(1))
	remote := -1
	for i := range 120 {
		if nodes[0].owner(i) == 1 {
			remote = i
			break
		}
	}
	require.GreaterOrEqual(t, remote, 0)
	_, err := nodes[0].GetBatch([]int{remote})
	require.True(t, errors.Is(err, loader.ErrInvalid))
	require.ErrorContains(t, err, "node 1 is at epoch 1, node 0 asks for epoch 0")
}

// Nodes of different budgets (layouts) cannot form a cluster.
func TestConnectChecksTheLayout(t *testing.T) {
	tp := newTestPack(t, 240, 8, 200, 10)
	small := tp.minBudget(2)
	n0, a0 := startNode(t, tp, 0, 2, small, Options{})
	_, a1 := startNode(t, tp, 1, 2, tp.dataBytes(), Options{})
	err := n0.Connect([]string{a0, a1})
	require.ErrorIs(t, err, loader.ErrInvalid)
	require.ErrorContains(t, err, "every node needs the same memory_budget")
}

// A sequence must be of the node's epoch and list each position once.
func TestSetSequenceChecks(t *testing.T) {
	tp := newTestPack(t, 40, 8, 50, 11)
	n, _ := startNode(t, tp, 0, 2, tp.minBudget(2)*2, Options{})
	require.ErrorContains(t, n.SetSequence(0, []int{1, 2, 1}), "position 1 at entries 0 and 2")
	require.ErrorContains(t, n.SetSequence(0, []int{40}), "outside the pack's 0..39")
	require.ErrorContains(t, n.SetSequence(3, []int{1}), "a sequence of epoch 3 for a node at epoch 0")
}

// A batch given back untaken (a DataLoader worker killed holding it) goes
// back to its owners, local and remote, undelivered again: asked again
// (its requests may now get other samples of the same slots, from the
// remote memory), the epoch still delivers every sample once.
func TestReturnedBatchGoesBackToItsOwners(t *testing.T) {
	tp := newTestPack(t, 240, 8, 300, 12)
	budget := max(tp.dataBytes()/2/2, tp.minBudget(2))
	nodes := cluster(t, tp, 2, budget, Options{RemoteBytes: budget / 4})
	seqs := shares(240, 2, 13)
	for r, n := range nodes {
		require.NoError(t, n.SetSequence(0, seqs[r]))
	}
	first := serveShares(t, nodes, [][]int{seqs[0][:24], seqs[1][:24]}, 8, 1)
	lost, err := nodes[0].GetBatch(seqs[0][24:40])
	require.NoError(t, err)
	owners := map[int]bool{}
	for _, s := range lost {
		owners[nodes[0].owner(s.Position)] = true
	}
	require.Len(t, owners, 2, "the batch has samples of both nodes' slots")
	served := func() int64 { return nodes[0].Server().Stats().Served + nodes[1].Server().Stats().Served }
	before := served()
	nodes[0].Return(lost)
	require.Equal(t, before-int64(len(lost)), served(), "undelivered again at their owners")
	rest := serveShares(t, nodes, [][]int{seqs[0][24:], seqs[1][24:]}, 8, 2)
	requireExactlyOnce(t, tp, [][]loader.Sample{first[0], first[1], rest[0], rest[1]})
}

// A damaged chunk at the owner fails the requester's batch with the
// owner's CorruptError message (the chunk file), through the call.
func TestOwnersCorruptChunkReachesTheRequester(t *testing.T) {
	tp := newTestPack(t, 240, 8, 300, 14)
	nodes := cluster(t, tp, 2, tp.minBudget(2)+2*tp.dataBytes(), Options{})
	for c := range tp.p.Index.Chunks {
		if nodes[0].owner(c*8) == 1 {
			path := tp.p.ChunkPath(c)
			info, err := os.Stat(path)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(path, make([]byte, info.Size()), 0o644))
		}
	}
	var remote []int
	for i := range 240 {
		if nodes[0].owner(i) == 1 && len(remote) < 16 {
			remote = append(remote, i)
		}
	}
	_, err := nodes[0].GetBatch(remote)
	require.ErrorIs(t, err, loader.ErrCorrupt)
	require.ErrorContains(t, err, "to node 1 (")
	require.ErrorContains(t, err, "is corrupt")
	require.ErrorContains(t, err, tp.p.Dir)
}
