package dist

import (
	"cmp"
	"context"
	"crypto/subtle"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pyfastensor/pyfastensor/loader"
	"github.com/pyfastensor/pyfastensor/loader/dist/distpb"
)

type peer struct {
	rank int
	addr string
	conn *grpc.ClientConn
	c    distpb.BrandClient
}

// Listen serves the other nodes on addr ("host:port"; port 0 picks one)
// until Close, and returns the address it listens on.
func (n *Node) Listen(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("loader/dist: node %d: listen on %s: %w", n.o.Rank, addr, err)
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(n.auth), grpc.MaxRecvMsgSize(maxMessage), grpc.MaxSendMsgSize(maxMessage),
		grpc.InitialWindowSize(flowWindow), grpc.InitialConnWindowSize(flowWindow))
	distpb.RegisterBrandServer(gs, n)
	n.mu.Lock()
	if n.gs != nil || n.closed {
		n.mu.Unlock()
		_ = ln.Close()
		return "", fmt.Errorf("%w: loader/dist: node %d listens already, or is closed", loader.ErrInvalid, n.o.Rank)
	}
	n.gs, n.ln = gs, ln
	n.mu.Unlock()
	go func() { _ = gs.Serve(ln) }()
	return ln.Addr().String(), nil
}

// Connect dials the other nodes at addrs (by rank; this node's own is
// skipped) and checks with each that it serves the same pack with the
// same layout, waiting up to the timeout for it to listen.
func (n *Node) Connect(addrs []string) error {
	if len(addrs) != n.o.World {
		return fmt.Errorf("%w: loader/dist: %d addresses for a world of %d", loader.ErrInvalid, len(addrs), n.o.World)
	}
	me := n.identity()
	for r, addr := range addrs {
		if r == n.o.Rank {
			continue
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(flowWindow), grpc.WithInitialConnWindowSize(flowWindow),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage)))
		if err != nil {
			return fmt.Errorf("loader/dist: node %d (%s): %w: %w", r, addr, ErrNodeFailed, err)
		}
		p := &peer{rank: r, addr: addr, conn: conn, c: distpb.NewBrandClient(conn)}
		n.mu.Lock()
		if old := n.peers[r]; old != nil {
			_ = old.conn.Close()
		}
		n.peers[r] = p
		n.mu.Unlock()
		ctx, cancel := n.ctx()
		resp, err := p.c.Hello(ctx, &distpb.HelloRequest{From: me}, grpc.WaitForReady(true))
		cancel()
		if err != nil {
			return n.callErr(p, "hello", err)
		}
		if err := sameCluster(me, resp.GetNode(), r); err != nil {
			return fmt.Errorf("loader/dist: node %d (%s): %w", r, addr, err)
		}
	}
	return nil
}

func (n *Node) identity() *distpb.Identity {
	st, _ := n.srv.State()
	return &distpb.Identity{Rank: int32(n.o.Rank), World: int32(n.o.World), Pack: st.Pack, IndexCrc: st.IndexCRC,
		ChunksPerGroup: int64(n.lay.ChunksPerGroup), AbstractChunks: int64(n.lay.AbstractChunks), Epoch: n.srv.Epoch()}
}

// sameCluster checks that the node of rank r (other) serves the same pack
// and layout as this one (me).
func sameCluster(me, other *distpb.Identity, r int) error {
	switch {
	case other == nil:
		return fmt.Errorf("%w: no identity in its answer", loader.ErrInvalid)
	case int(other.GetRank()) != r || other.GetWorld() != me.GetWorld():
		return fmt.Errorf("%w: it is rank %d of %d, expected rank %d of %d (two jobs on one address?)",
			loader.ErrInvalid, other.GetRank(), other.GetWorld(), r, me.GetWorld())
	case other.GetPack() != me.GetPack() || other.GetIndexCrc() != me.GetIndexCrc():
		return fmt.Errorf("%w: it serves pack %s (index CRC-32 %#08x), this node %s (%#08x)",
			loader.ErrInvalid, other.GetPack(), other.GetIndexCrc(), me.GetPack(), me.GetIndexCrc())
	case other.GetChunksPerGroup() != me.GetChunksPerGroup() || other.GetAbstractChunks() != me.GetAbstractChunks():
		return fmt.Errorf("%w: its layout is %d abstract chunks of %d chunks, this node's %d of %d (every node needs the same memory_budget)",
			loader.ErrInvalid, other.GetAbstractChunks(), other.GetChunksPerGroup(), me.GetAbstractChunks(), me.GetChunksPerGroup())
	}
	return nil
}

// auth refuses a call without the job's token.
func (n *Node) auth(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	got := md.Get(TokenKey)
	if len(got) != 1 || subtle.ConstantTimeCompare([]byte(got[0]), []byte(n.o.Token)) != 1 {
		why := "carries no token"
		if len(got) > 0 {
			why = "carries another token than this job's"
		}
		return nil, status.Errorf(codes.Unauthenticated, "loader/dist: node %d refuses %s: the call %s", n.o.Rank, info.FullMethod, why)
	}
	return h(ctx, req)
}

// ctx is a call's context: the timeout and the token.
func (n *Node) ctx() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), n.o.Timeout)
	return metadata.AppendToOutgoingContext(ctx, TokenKey, n.o.Token), cancel
}

// callErr is the error of a call to p that failed: the owner's loader
// errors keep their kind, anything else is ErrNodeFailed; both name the
// node and its address.
func (n *Node) callErr(p *peer, what string, err error) error {
	st, _ := status.FromError(err)
	kind := ErrNodeFailed
	switch st.Code() {
	case codes.InvalidArgument, codes.FailedPrecondition:
		kind = loader.ErrInvalid
	case codes.DataLoss:
		kind = loader.ErrCorrupt
	}
	return fmt.Errorf("loader/dist: node %d: %s to node %d (%s) failed: %w: %s", n.o.Rank, what, p.rank, p.addr, kind, st.Message())
}

func fromPB(s *distpb.Sample, epoch uint64) loader.Sample {
	data := s.GetData()
	if data == nil {
		data = []byte{}
	}
	return loader.Sample{Request: int(s.GetRequest()), Position: int(s.GetPosition()), Source: int(s.GetSource()),
		Label: int(s.GetLabel()), Epoch: epoch, Data: data}
}

func toPB(s loader.Sample) *distpb.Sample {
	return &distpb.Sample{Request: int64(s.Request), Position: int64(s.Position), Source: int64(s.Source), Label: int64(s.Label), Data: s.Data}
}

// giveBack returns samples to their owners (loader.Server.Return), by
// owner; a node that does not answer keeps none (its error is reported
// elsewhere). It returns the first error.
func (n *Node) giveBack(by map[int][]loader.Sample) error {
	var first error
	for o, smps := range by {
		if o == n.o.Rank {
			n.srv.Return(smps)
			continue
		}
		p := n.peers[o]
		if p == nil {
			continue
		}
		req := &distpb.GiveBackRequest{Rank: int32(n.o.Rank), Epoch: smps[0].Epoch}
		for _, s := range smps {
			req.Samples = append(req.Samples, toPB(s))
		}
		ctx, cancel := n.ctx()
		_, err := p.c.GiveBack(ctx, req)
		cancel()
		if err != nil {
			first = cmp.Or(first, n.callErr(p, fmt.Sprintf("giving back %d samples", len(smps)), err))
		}
	}
	return first
}
