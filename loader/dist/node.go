// Package dist is the Brand loader across nodes (the paper's section
// 3.4): each node's loader.Server owns a disjoint share of the abstract
// chunks (loader.ServerOptions Rank and World: abstract chunk g is node
// g % World's); a Node serves requests for its own share from its server
// and sends the others, batched per owner, to their owner over gRPC. The
// owner answers with the samples its server delivers for them (GetBatch)
// and, opportunistically, with samples already in its memory for the
// requester's upcoming requests (loader.Server.Prefetch), which the
// requester keeps in its remote abstract memory, within a byte limit, and
// serves later requests of those slots from.
//
// Exactly once per epoch: every sample is delivered by its owner's server
// once, to a local request, a remote one or a prefetch; a prefetched
// sample is only sent for a slot that is free in the requester's remote
// memory, matched to a request of the requester's access sequence for
// that slot not yet issued (the first such in its window), so a later
// request of the requester consumes it. So when the nodes' requests
// partition a permutation of the pack's positions (each node asking for
// its sampler's share), the union of what the nodes deliver is every
// sample once. The order depends on how the nodes' requests interleave at
// each owner, not on (seed, epoch, request sequence) alone as on one node.
//
// Security: a node listens on the address it is given (the process
// group's interface, not every interface) and refuses any call that does
// not carry the job's token (a secret shared through the job's store) in
// its metadata. The transport is not encrypted: the token keeps other
// jobs and stray clients out, not an eavesdropper on the job's network.
package dist

import (
	"cmp"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/loader"
	"github.com/pyfastensor/pyfastensor/loader/dist/distpb"
)

// TokenKey is the metadata key every call carries the job's token in.
const TokenKey = "pyfastensor-token"

// DefaultWindow is how many of the requester's upcoming requests an owner
// may prefetch for (Options.Window). Not tuned: the paper does not give
// its window; it bounds the scan per miss, while the remote memory limit
// bounds what is held.
const DefaultWindow = 256

// DefaultTimeout bounds one call to another node (Options.Timeout): a
// node that does not answer in that time counts as failed.
const DefaultTimeout = 120 * time.Second

// maxMessage bounds a message between nodes: a batch's samples plus the
// prefetched ones (at most the remote memory limit).
const maxMessage = 1 << 30

// flowWindow is each HTTP/2 stream's and connection's flow-control
// window: an answer of a batch and its prefetch (hundreds of KiB) then
// crosses without waiting for window updates (gRPC's default starts at
// 64 KiB and grows with its estimate of the link).
const flowWindow = 16 << 20

// ErrNodeFailed: another node did not answer (killed, unreachable, timed
// out) or refused the call. The message names the node and its address.
var ErrNodeFailed = gds.Named(gds.ErrUnavailable, "a node of the loader cluster failed")

// Options configure a Node.
type Options struct {
	Rank  int `json:"rank"`
	World int `json:"world"`
	// Token is the job's secret: every call carries it, and a node
	// refuses calls without it.
	Token string `json:"token"`
	// RemoteBytes is the remote abstract memory's limit: the bytes of
	// prefetched samples this node holds at most.
	RemoteBytes int64 `json:"remote_bytes"`
	// Window is how many upcoming requests of the access sequence a miss
	// offers its owner to prefetch for; 0 means DefaultWindow.
	Window int `json:"window"`
	// NoPrefetch sends the requests only (the paper's
	// Brand-no-prefetching), for comparison.
	NoPrefetch bool `json:"no_prefetch"`
	// Timeout bounds each call to another node; 0 means DefaultTimeout.
	Timeout time.Duration `json:"timeout"`
}

// Stats count a node's distributed work in the current epoch (SetEpoch
// and Restore zero them but the peak).
type Stats struct {
	Rank  int `json:"rank"`
	World int `json:"world"`
	// Requests for positions this node owns, served by its server.
	LocalRequests int64 `json:"local_requests"`
	// Requests for positions other nodes own: served from the remote
	// memory (hits, prefetched earlier) or from the owner (misses).
	RemoteHits   int64 `json:"remote_hits"`
	RemoteMisses int64 `json:"remote_misses"`
	// RemoteRequests are the Fetch calls sent (a batch's misses, one per
	// owner).
	RemoteRequests int64 `json:"remote_requests"`
	// Prefetched samples received, and their bytes.
	Prefetched      int64 `json:"prefetched"`
	PrefetchedBytes int64 `json:"prefetched_bytes"`
	// As owner: samples delivered to other nodes' misses and prefetched
	// for them.
	ServedRemote int64 `json:"served_remote"`
	PrefetchSent int64 `json:"prefetch_sent"`
	// The remote memory now, at most, and its limit.
	RemoteHeldBytes int64 `json:"remote_held_bytes"`
	RemotePeakBytes int64 `json:"remote_peak_bytes"`
	RemoteLimit     int64 `json:"remote_limit"`
}

// State is a node's state: its server's (the owner side), with the
// position in its access sequence. The remote memory is not in it: Drop
// gives it back to the owners first (and every node's Drop must come
// before any node's State).
type State struct {
	loader.State
	Rank  int `json:"rank"`
	World int `json:"world"`
	// Issued is how many requests of the access sequence (SetSequence)
	// were issued, a prefix when they came in order: where a sampler
	// resumes.
	Issued int `json:"issued"`
}

type peer struct {
	rank int
	addr string
	conn *grpc.ClientConn
	c    distpb.BrandClient
}

// Node is one node of a cluster of loader servers.
type Node struct {
	distpb.UnimplementedBrandServer
	srv    *loader.Server
	lay    loader.Layout
	o      Options
	window int

	gs    *grpc.Server
	ln    net.Listener
	peers []*peer // by rank; nil for this node

	servedRemote, prefetchSent atomic.Int64

	mu     sync.Mutex
	closed bool
	// The access sequence of this epoch (SetSequence): positions in
	// request order, each one's index, which are issued, and the first
	// not issued.
	seq    []int
	seqAt  map[int]int
	issued []bool
	cursor int
	// The remote abstract memory: a prefetched sample by slot (abstract
	// chunk g's slot k at g*N+k); its bytes, and the bytes promised to
	// calls in flight.
	remote         map[int]loader.Sample
	held, reserved int64
	// Slots offered to an owner by a call in flight: closed when it ends.
	pending map[int]chan struct{}
	stats   Stats
}

// NewNode makes srv, built with ServerOptions Rank and World as o's, a
// node of the cluster. Listen, then Connect, before serving.
func NewNode(srv *loader.Server, o Options) (*Node, error) {
	lay := srv.Layout()
	switch {
	case o.World < 1 || o.Rank < 0 || o.Rank >= o.World:
		return nil, fmt.Errorf("%w: loader/dist: rank %d of a world of %d", loader.ErrInvalid, o.Rank, o.World)
	case o.Token == "":
		return nil, fmt.Errorf("%w: loader/dist: no token: every call between nodes carries the job's", loader.ErrInvalid)
	case o.RemoteBytes < 0 || o.Window < 0 || o.Timeout < 0:
		return nil, fmt.Errorf("%w: loader/dist: remote memory %d bytes, window %d, timeout %v", loader.ErrInvalid, o.RemoteBytes, o.Window, o.Timeout)
	}
	owned := map[int]bool{}
	for _, g := range lay.Owned {
		owned[g] = true
	}
	for g := range lay.AbstractChunks {
		if owned[g] != (g%o.World == o.Rank) {
			return nil, fmt.Errorf("%w: loader/dist: the server's abstract chunks are not rank %d's of %d (abstract chunk %d): "+
				"make it with ServerOptions Rank and World", loader.ErrInvalid, o.Rank, o.World, g)
		}
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	w := o.Window
	if w == 0 {
		w = DefaultWindow
	}
	n := &Node{srv: srv, lay: lay, o: o, window: w, peers: make([]*peer, o.World),
		remote: map[int]loader.Sample{}, pending: map[int]chan struct{}{}}
	n.stats = Stats{Rank: o.Rank, World: o.World, RemoteLimit: o.RemoteBytes}
	return n, nil
}

// Server is the node's server (its own share).
func (n *Node) Server() *loader.Server { return n.srv }

// Len is the number of samples (positions) of the pack.
func (n *Node) Len() int { return n.srv.Len() }

// Epoch is the current epoch.
func (n *Node) Epoch() uint64 { return n.srv.Epoch() }

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

// slot is the slot position i maps to (abstract chunk g's slot k at
// g*N+k), and owner the node that owns it.
func (n *Node) slot(i int) int {
	size := n.lay.ChunkSize
	return i/size/n.lay.ChunksPerGroup*size + i%size
}

func (n *Node) owner(i int) int { return i / n.lay.ChunkSize / n.lay.ChunksPerGroup % n.o.World }

// SetSequence gives the node its access sequence of epoch: the positions
// its sampler asks for, in order, each at most once (its share of the
// epoch's permutation; after a Restore, the rest of it). Prefetch offers
// owners the slots of its upcoming requests; without a sequence every
// remote request is a miss.
func (n *Node) SetSequence(epoch uint64, seq []int) error {
	at := make(map[int]int, len(seq))
	for k, i := range seq {
		if i < 0 || i >= n.lay.Samples {
			return fmt.Errorf("%w: loader/dist: sequence entry %d: position %d outside the pack's 0..%d", loader.ErrInvalid, k, i, n.lay.Samples-1)
		}
		if j, dup := at[i]; dup {
			return fmt.Errorf("%w: loader/dist: position %d at entries %d and %d of the sequence: an epoch asks for each once", loader.ErrInvalid, i, j, k)
		}
		at[i] = k
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if e := n.srv.Epoch(); e != epoch {
		return fmt.Errorf("%w: loader/dist: a sequence of epoch %d for a node at epoch %d", loader.ErrInvalid, epoch, e)
	}
	n.seq, n.seqAt, n.issued, n.cursor = slices.Clone(seq), at, make([]bool, len(seq)), 0
	return nil
}

// issue marks the request for i issued in the sequence; unissue undoes it
// (a request given back, to be asked again).
func (n *Node) issue(i int) {
	if k, ok := n.seqAt[i]; ok {
		n.issued[k] = true
		for n.cursor < len(n.issued) && n.issued[n.cursor] {
			n.cursor++
		}
	}
}

func (n *Node) unissue(i int) {
	if k, ok := n.seqAt[i]; ok && n.issued[k] {
		n.issued[k] = false
		n.cursor = min(n.cursor, k)
	}
}

// windowOf is what a miss to owner o offers it: the positions of the next
// n.window requests of the sequence not issued yet that map to o's slots,
// the first of each slot only, each slot free in the remote memory and
// not offered by a call in flight.
func (n *Node) windowOf(o int) []int {
	var out []int
	seen := map[int]bool{}
	for k, looked := n.cursor, 0; k < len(n.seq) && looked < n.window; k++ {
		if n.issued[k] {
			continue
		}
		looked++
		i := n.seq[k]
		x := n.slot(i)
		if seen[x] {
			continue
		}
		seen[x] = true // a later request of the slot waits for this one's
		if n.owner(i) != o {
			continue
		}
		if _, held := n.remote[x]; held {
			continue
		}
		if _, offered := n.pending[x]; offered {
			continue
		}
		out = append(out, i)
	}
	return out
}

// fetch is one call to an owner: the indices of the batch's requests it
// answers, and what it offered to prefetch for.
type fetch struct {
	p      *peer
	ks     []int
	window []int
	free   int64
	done   chan struct{}
	resp   *distpb.FetchResponse
	err    error
}

// GetBatch serves requests for the positions is, in order (the
// loader.Server contract): a position this node owns by its server, one
// another owns from the remote memory when a prefetch put a sample in its
// slot, else from its owner, the batch's misses sent in one call per
// owner. On an error nothing is kept: what was served is given back.
func (n *Node) GetBatch(is []int) ([]loader.Sample, error) {
	for _, i := range is {
		if i < 0 || i >= n.lay.Samples {
			return nil, fmt.Errorf("%w: position %d outside the pack's 0..%d", loader.ErrInvalid, i, n.lay.Samples-1)
		}
	}
	out := make([]loader.Sample, len(is))
	got := make([]bool, len(is))
	var local, localAt []int
	miss := map[int][]int{}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, loader.ErrClosed
	}
	epoch := n.srv.Epoch()
	for k, i := range is {
		n.issue(i)
		o := n.owner(i)
		if o == n.o.Rank {
			local, localAt = append(local, i), append(localAt, k)
			n.stats.LocalRequests++
			continue
		}
		x := n.slot(i)
		for {
			ch, ok := n.pending[x]
			if !ok {
				break
			}
			n.mu.Unlock() // an owner may be prefetching for this slot
			<-ch
			n.mu.Lock()
		}
		if smp, ok := n.remote[x]; ok {
			delete(n.remote, x)
			n.held -= int64(len(smp.Data))
			smp.Request = i
			out[k], got[k] = smp, true
			n.stats.RemoteHits++
			continue
		}
		miss[o] = append(miss[o], k)
		n.stats.RemoteMisses++
	}
	owners := make([]int, 0, len(miss))
	for o := range miss {
		owners = append(owners, o)
	}
	slices.Sort(owners)
	calls := make([]*fetch, 0, len(owners))
	var missing error
	for _, o := range owners {
		if n.peers[o] == nil {
			missing = fmt.Errorf("%w: loader/dist: node %d is not connected to node %d (Connect first)", loader.ErrInvalid, n.o.Rank, o)
			owners = nil
		}
	}
	for _, o := range owners {
		c := &fetch{p: n.peers[o], ks: miss[o]}
		if !n.o.NoPrefetch && n.seq != nil {
			free := max(0, n.o.RemoteBytes-n.held-n.reserved) / int64(len(owners))
			if free > 0 {
				c.window = n.windowOf(o)
			}
			if len(c.window) > 0 {
				c.free, c.done = free, make(chan struct{})
				n.reserved += free
				for _, i := range c.window {
					n.pending[n.slot(i)] = c.done
				}
			}
		}
		calls = append(calls, c)
	}
	n.stats.RemoteRequests += int64(len(calls))
	n.mu.Unlock()

	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pos := make([]int64, len(c.ks))
			for j, k := range c.ks {
				pos[j] = int64(is[k])
			}
			win := make([]int64, len(c.window))
			for j, i := range c.window {
				win[j] = int64(i)
			}
			ctx, cancel := n.ctx()
			defer cancel()
			c.resp, c.err = c.p.c.Fetch(ctx, &distpb.FetchRequest{Rank: int32(n.o.Rank), Epoch: epoch, Positions: pos, Window: win, FreeBytes: c.free})
			if c.err != nil {
				c.err = n.callErr(c.p, fmt.Sprintf("a request of %d samples", len(pos)), c.err)
			} else if len(c.resp.GetSamples()) != len(pos) {
				c.err = fmt.Errorf("loader/dist: node %d: node %d (%s) answered %d requests with %d samples: %w",
					n.o.Rank, c.p.rank, c.p.addr, len(pos), len(c.resp.GetSamples()), ErrNodeFailed)
			}
		}()
	}
	first := missing
	if len(local) > 0 {
		if smps, err := n.srv.GetBatch(local); err != nil {
			first = cmp.Or(first, fmt.Errorf("loader/dist: node %d: %w", n.o.Rank, err))
		} else {
			for j, k := range localAt {
				out[k], got[k] = smps[j], true
			}
		}
	}
	wg.Wait()

	back := map[int][]loader.Sample{} // by owner: to give back
	n.mu.Lock()
	for _, c := range calls {
		if c.err == nil {
			for j, s := range c.resp.GetSamples() {
				k := c.ks[j]
				out[k], got[k] = fromPB(s, epoch), true
				out[k].Request = is[k]
			}
		}
		offered := map[int]bool{}
		for _, i := range c.window {
			offered[n.slot(i)] = true
		}
		for _, s := range c.resp.GetPrefetched() {
			smp := fromPB(s, epoch)
			x := n.slot(smp.Request)
			_, held := n.remote[x]
			if !offered[x] || held || n.slot(smp.Position) != x || n.srv.Epoch() != epoch {
				back[c.p.rank] = append(back[c.p.rank], smp) // not what was offered: the owner's again
				continue
			}
			delete(offered, x)
			n.remote[x] = smp
			n.held += int64(len(smp.Data))
			n.stats.Prefetched++
			n.stats.PrefetchedBytes += int64(len(smp.Data))
		}
		if c.done != nil {
			for _, i := range c.window {
				delete(n.pending, n.slot(i))
			}
			close(c.done)
			n.reserved -= c.free
		}
		first = cmp.Or(first, c.err)
	}
	n.stats.RemotePeakBytes = max(n.stats.RemotePeakBytes, n.held)
	if first != nil {
		for k, i := range is {
			n.unissue(i)
			if got[k] {
				back[n.owner(out[k].Position)] = append(back[n.owner(out[k].Position)], out[k])
			}
		}
	}
	n.mu.Unlock()
	if len(back) > 0 {
		n.giveBack(back)
	}
	if first != nil {
		return nil, first
	}
	return out, nil
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

// Return gives back samples a GetBatch delivered that their requester did
// not take (a DataLoader worker that died holding its batch): each to its
// owner's server, undelivered again; their requests are unissued, to be
// asked again.
func (n *Node) Return(samples []loader.Sample) {
	by := map[int][]loader.Sample{}
	n.mu.Lock()
	for _, s := range samples {
		if s.Position < 0 || s.Position >= n.lay.Samples {
			continue
		}
		n.unissue(s.Request)
		by[n.owner(s.Position)] = append(by[n.owner(s.Position)], s)
	}
	n.mu.Unlock()
	_ = n.giveBack(by)
}

// Release gives the memory of samples a GetBatch delivered, whose bytes
// the requester copied out, to this node's server for its later reads
// (loader.Server.Release; the bytes of samples from other nodes are the
// node's own copies, reused as well).
func (n *Node) Release(samples []loader.Sample) { n.srv.Release(samples) }

// Drop gives every sample of the remote memory back to its owner, after
// the calls in flight: before a State, on every node before any node's
// State (the owners' states then hold them as spares).
func (n *Node) Drop() error {
	n.mu.Lock()
	for len(n.pending) > 0 {
		var ch chan struct{}
		for _, c := range n.pending {
			ch = c
			break
		}
		n.mu.Unlock()
		<-ch
		n.mu.Lock()
	}
	by := map[int][]loader.Sample{}
	for x, s := range n.remote {
		by[n.owner(s.Position)] = append(by[n.owner(s.Position)], s)
		delete(n.remote, x)
		n.unissue(s.Request)
	}
	n.held = 0
	n.mu.Unlock()
	return n.giveBack(by)
}

// SetEpoch starts epoch e on this node: its server's epoch, an empty
// remote memory, no access sequence. Every node must set it before any
// asks for the epoch's samples (an owner refuses another epoch's).
func (n *Node) SetEpoch(e uint64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.srv.SetEpoch(e); err != nil {
		return err
	}
	n.reset()
	return nil
}

// reset empties the remote memory and forgets the sequence and counters.
func (n *Node) reset() {
	n.remote, n.held = map[int]loader.Sample{}, 0
	n.seq, n.seqAt, n.issued, n.cursor = nil, nil, nil, 0
	n.stats = Stats{Rank: n.o.Rank, World: n.o.World, RemoteLimit: n.o.RemoteBytes, RemotePeakBytes: n.stats.RemotePeakBytes}
	n.servedRemote.Store(0)
	n.prefetchSent.Store(0)
}

// State is the node's state. Its remote memory must be empty (Drop on
// every node first), and no request in flight anywhere in the cluster.
func (n *Node) State() (State, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.remote) > 0 || len(n.pending) > 0 {
		return State{}, fmt.Errorf("%w: loader/dist: node %d holds %d prefetched samples: Drop them (on every node) before taking the state",
			loader.ErrState, n.o.Rank, len(n.remote))
	}
	st, err := n.srv.State()
	if err != nil {
		return State{}, err
	}
	return State{State: st, Rank: n.o.Rank, World: n.o.World, Issued: n.cursor}, nil
}

// Restore puts the node in st, taken by State of the node of the same
// rank in a cluster of the same world (loader.Server.Restore checks the
// rest). The access sequence is forgotten: SetSequence the rest of it.
func (n *Node) Restore(st State) error {
	if st.Rank != n.o.Rank || st.World != n.o.World {
		return fmt.Errorf("%w: loader/dist: a state of rank %d of %d for rank %d of %d", loader.ErrState, st.Rank, st.World, n.o.Rank, n.o.World)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.srv.Restore(st.State); err != nil {
		return err
	}
	n.reset()
	return nil
}

// Stats are the node's counters.
func (n *Node) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.stats
	st.RemoteHeldBytes = n.held
	st.ServedRemote, st.PrefetchSent = n.servedRemote.Load(), n.prefetchSent.Load()
	return st
}

// Close stops serving the other nodes and closes the connections to them
// (not the server: its owner closes it).
func (n *Node) Close() error {
	n.mu.Lock()
	n.closed = true
	gs, peers := n.gs, n.peers
	n.mu.Unlock()
	if gs != nil {
		gs.Stop()
	}
	for _, p := range peers {
		if p != nil {
			_ = p.conn.Close()
		}
	}
	return nil
}

// The service, for the other nodes.

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
