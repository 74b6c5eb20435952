// The gRPC service a node offers the other nodes: Hello, Fetch and GiveBack.

package dist

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/loader"
	"github.com/pyfastensor/pyfastensor/loader/dist/distpb"
)

// Hello answers with this node's identity.
func (n *Node) Hello(_ context.Context, req *distpb.HelloRequest) (*distpb.HelloResponse, error) {
	return &distpb.HelloResponse{Node: n.identity()}, nil
}

// Fetch serves another node's misses, then prefetches along its window.
func (n *Node) Fetch(_ context.Context, req *distpb.FetchRequest) (*distpb.FetchResponse, error) {
	pos, win, err := n.checkFetch(req)
	if err != nil {
		return nil, err
	}
	smps, err := n.srv.GetBatch(pos)
	if err != nil {
		return nil, statusOf(n.o.Rank, int(req.GetRank()), err)
	}
	resp := &distpb.FetchResponse{Samples: make([]*distpb.Sample, len(smps))}
	for k, s := range smps {
		resp.Samples[k] = toPB(s)
	}
	n.servedRemote.Add(int64(len(smps)))
	if len(win) > 0 && req.GetFreeBytes() > 0 {
		for _, s := range n.srv.Prefetch(win, req.GetFreeBytes()) {
			resp.Prefetched = append(resp.Prefetched, toPB(s))
		}
		n.prefetchSent.Add(int64(len(resp.Prefetched)))
	}
	return resp, nil
}

// checkFetch checks a Fetch before any of it is served: the requester is
// another node of the cluster at this node's epoch, and every position is
// this node's.
func (n *Node) checkFetch(req *distpb.FetchRequest) (pos, win []int, err error) {
	r, samples := int(req.GetRank()), n.lay.Samples
	switch e := n.srv.Epoch(); {
	case r < 0 || r >= n.o.World || r == n.o.Rank:
		return nil, nil, status.Errorf(codes.InvalidArgument, "loader/dist: node %d: a request from rank %d in a world of %d", n.o.Rank, r, n.o.World)
	case req.GetEpoch() != e:
		return nil, nil, status.Errorf(codes.FailedPrecondition,
			"loader/dist: node %d is at epoch %d, node %d asks for epoch %d: every node sets the epoch before any asks for it", n.o.Rank, e, r, req.GetEpoch())
	case len(req.GetPositions()) > samples || len(req.GetWindow()) > samples:
		return nil, nil, status.Errorf(codes.InvalidArgument, "loader/dist: node %d: %d requests and a window of %d for %d samples",
			n.o.Rank, len(req.GetPositions()), len(req.GetWindow()), samples)
	}
	for _, list := range []struct {
		in  []int64
		out *[]int
	}{{req.GetPositions(), &pos}, {req.GetWindow(), &win}} {
		*list.out = make([]int, len(list.in))
		for k, v := range list.in {
			if v < 0 || v >= int64(samples) {
				return nil, nil, status.Errorf(codes.InvalidArgument, "loader/dist: node %d: position %d from node %d outside the pack's 0..%d", n.o.Rank, v, r, samples-1)
			}
			if o := n.owner(int(v)); o != n.o.Rank {
				return nil, nil, status.Errorf(codes.InvalidArgument, "loader/dist: node %d: position %d from node %d is node %d's", n.o.Rank, v, r, o)
			}
			(*list.out)[k] = int(v)
		}
	}
	return pos, win, nil
}

// GiveBack takes back samples this node delivered to another that did not
// use them (loader.Server.Return: another epoch's are dropped).
func (n *Node) GiveBack(_ context.Context, req *distpb.GiveBackRequest) (*distpb.GiveBackResponse, error) {
	smps := make([]loader.Sample, 0, len(req.GetSamples()))
	for _, s := range req.GetSamples() {
		if p := s.GetPosition(); p < 0 || p >= int64(n.lay.Samples) || n.owner(int(p)) != n.o.Rank {
			return nil, status.Errorf(codes.InvalidArgument, "loader/dist: node %d: node %d gives back position %d, not this node's", n.o.Rank, req.GetRank(), p)
		}
		smps = append(smps, fromPB(s, req.GetEpoch()))
	}
	n.srv.Return(smps)
	return &distpb.GiveBackResponse{Accepted: int64(len(smps))}, nil
}

// statusOf is the gRPC status of a loader error an owner met serving node
// r's request.
func statusOf(rank, r int, err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, loader.ErrCorrupt):
		code = codes.DataLoss
	case errors.Is(err, loader.ErrClosed):
		code = codes.Unavailable
	case errors.Is(err, gds.ErrInvalid):
		code = codes.InvalidArgument
	}
	return status.Errorf(code, "loader/dist: node %d serving node %d: %v", rank, r, err)
}
