package dist

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/pyfastensor/pyfastensor/loader/dist/distpb"
)

// An owner checks what another node asks of it before serving any of it:
// whatever a Fetch message holds (decoded by protobuf), the owner answers
// with an error or with samples of its own slots only, one per position,
// prefetched ones within the free bytes, and never panics.
func FuzzFetch(f *testing.F) {
	tp := newTestPack(f, 96, 8, 120, 21)
	n, _ := startNode(f, tp, 0, 2, tp.minBudget(2)+2*tp.dataBytes(), Options{})
	seed := func(r *distpb.FetchRequest) {
		b, err := proto.Marshal(r)
		require.NoError(f, err)
		f.Add(b)
	}
	var own []int64
	for i := range 96 {
		if n.owner(i) == 0 {
			own = append(own, int64(i))
		}
	}
	seed(&distpb.FetchRequest{Rank: 1, Positions: own[:2], Window: own[2:6], FreeBytes: 500})
	seed(&distpb.FetchRequest{Rank: 1, Positions: []int64{-1}})
	seed(&distpb.FetchRequest{Rank: 0, Positions: own[:1]})
	seed(&distpb.FetchRequest{Rank: 1, Epoch: 3, Positions: own[:1]})
	seed(&distpb.FetchRequest{Rank: 1, Positions: []int64{own[0], own[0], own[0]}})
	f.Fuzz(func(t *testing.T, b []byte) {
		var req distpb.FetchRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		resp, err := n.Fetch(context.Background(), &req)
		if err != nil {
			require.Nil(t, resp)
			return
		}
		require.Len(t, resp.GetSamples(), len(req.GetPositions()))
		var bytes int64
		for _, s := range append(resp.GetSamples(), resp.GetPrefetched()...) {
			require.Equal(t, 0, n.owner(int(s.GetPosition())), "position %d", s.GetPosition())
			require.Equal(t, n.slot(int(s.GetRequest())), n.slot(int(s.GetPosition())))
			require.Equal(t, tp.data[s.GetSource()], s.GetData())
		}
		for _, s := range resp.GetPrefetched() {
			bytes += int64(len(s.GetData()))
		}
		require.LessOrEqual(t, bytes, max(req.GetFreeBytes(), 0))
		if n.Server().Stats().Served > 60 {
			require.NoError(t, n.SetEpoch(n.Epoch()))
		}
	})
}
