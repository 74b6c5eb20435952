package dist

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"

	"github.com/pyfastensor/pyfastensor/loader"
	"github.com/pyfastensor/pyfastensor/loader/dist/distpb"
)

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
