package dist

import (
	"cmp"
	"fmt"
	"slices"
	"sync"

	"github.com/pyfastensor/pyfastensor/loader"
	"github.com/pyfastensor/pyfastensor/loader/dist/distpb"
)

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

// batch is one GetBatch on its way: what each request got, which are
// served by this node's server, and the misses by owner.
type batch struct {
	is      []int
	epoch   uint64
	out     []loader.Sample
	got     []bool
	local   []int         // positions this node owns, for its server
	localAt []int         // their indices in is
	miss    map[int][]int // by owner: indices in is of the remote misses
}

// GetBatch serves requests for the positions is, in order (the
// loader.Server contract): a position this node owns by its server, one
// another owns from the remote memory when a prefetch put a sample in its
// slot, else from its owner, the batch's misses sent in one call per
// owner. On an error nothing is kept: what was served is given back.
//
// The steps: route each request (local, a hit in the remote memory, or a
// miss), plan one call per owner of misses (reserving remote memory for
// what it may prefetch), send the calls while the server serves the local
// requests, then collect the answers and keep the prefetched samples.
func (n *Node) GetBatch(is []int) ([]loader.Sample, error) {
	for _, i := range is {
		if i < 0 || i >= n.lay.Samples {
			return nil, fmt.Errorf("%w: position %d outside the pack's 0..%d", loader.ErrInvalid, i, n.lay.Samples-1)
		}
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, loader.ErrClosed
	}
	b := n.route(is)
	calls, missing := n.planCalls(b.miss)
	n.mu.Unlock()

	localErr := n.serve(b, calls)

	n.mu.Lock()
	back := map[int][]loader.Sample{} // by owner: to give back
	first := cmp.Or(missing, localErr, n.collect(b, calls, back))
	n.stats.RemotePeakBytes = max(n.stats.RemotePeakBytes, n.held)
	if first != nil {
		n.undo(b, back)
	}
	n.mu.Unlock()
	if len(back) > 0 {
		n.giveBack(back)
	}
	if first != nil {
		return nil, first
	}
	return b.out, nil
}

// route issues each request of is and sorts it: a position this node owns
// for its server, one whose slot holds a prefetched sample served from the
// remote memory at once (after any call in flight that may prefetch for
// the slot), else a miss for its owner. n.mu is held (and released while
// waiting for a call in flight).
func (n *Node) route(is []int) *batch {
	b := &batch{is: is, epoch: n.srv.Epoch(), out: make([]loader.Sample, len(is)), got: make([]bool, len(is)), miss: map[int][]int{}}
	for k, i := range is {
		n.issue(i)
		o := n.owner(i)
		if o == n.o.Rank {
			b.local, b.localAt = append(b.local, i), append(b.localAt, k)
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
			b.out[k], b.got[k] = smp, true
			n.stats.RemoteHits++
			continue
		}
		b.miss[o] = append(b.miss[o], k)
		n.stats.RemoteMisses++
	}
	return b
}

// planCalls makes one call per owner of misses, in rank order, each
// offering its owner the window of upcoming requests to prefetch for and
// an equal share of the free remote memory (reserved, and the window's
// slots marked pending, until the call ends). An owner not connected
// fails the batch: no call is made. n.mu is held.
func (n *Node) planCalls(miss map[int][]int) ([]*fetch, error) {
	owners := make([]int, 0, len(miss))
	for o := range miss {
		owners = append(owners, o)
	}
	slices.Sort(owners)
	var missing error
	for _, o := range owners {
		if n.peers[o] == nil {
			missing = fmt.Errorf("%w: loader/dist: node %d is not connected to node %d (Connect first)", loader.ErrInvalid, n.o.Rank, o)
			owners = nil
		}
	}
	calls := make([]*fetch, 0, len(owners))
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
	return calls, missing
}

// serve sends the calls, each on its own goroutine, while this node's
// server serves the local requests, and waits for the calls. It returns
// the local requests' error; each call keeps its own. n.mu is not held.
func (n *Node) serve(b *batch, calls []*fetch) error {
	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.send(c, b)
		}()
	}
	var err error
	if len(b.local) > 0 {
		if smps, lerr := n.srv.GetBatch(b.local); lerr != nil {
			err = fmt.Errorf("loader/dist: node %d: %w", n.o.Rank, lerr)
		} else {
			for j, k := range b.localAt {
				b.out[k], b.got[k] = smps[j], true
			}
		}
	}
	wg.Wait()
	return err
}

// send makes call c: its misses and window to its owner; c.resp or c.err
// is the outcome (an answer with a sample missing is an error).
func (n *Node) send(c *fetch, b *batch) {
	pos := make([]int64, len(c.ks))
	for j, k := range c.ks {
		pos[j] = int64(b.is[k])
	}
	win := make([]int64, len(c.window))
	for j, i := range c.window {
		win[j] = int64(i)
	}
	ctx, cancel := n.ctx()
	defer cancel()
	c.resp, c.err = c.p.c.Fetch(ctx, &distpb.FetchRequest{Rank: int32(n.o.Rank), Epoch: b.epoch, Positions: pos, Window: win, FreeBytes: c.free})
	if c.err != nil {
		c.err = n.callErr(c.p, fmt.Sprintf("a request of %d samples", len(pos)), c.err)
	} else if len(c.resp.GetSamples()) != len(pos) {
		c.err = fmt.Errorf("loader/dist: node %d: node %d (%s) answered %d requests with %d samples: %w",
			n.o.Rank, c.p.rank, c.p.addr, len(pos), len(c.resp.GetSamples()), ErrNodeFailed)
	}
}

// collect takes the calls' answers: the misses' samples into b, each
// prefetched sample into the remote memory when it is what was offered
// (its slot, still free, at the batch's epoch), else into back for its
// owner; then it ends each call's reservation. It returns the first
// call's error. n.mu is held.
func (n *Node) collect(b *batch, calls []*fetch, back map[int][]loader.Sample) error {
	var first error
	for _, c := range calls {
		if c.err == nil {
			for j, s := range c.resp.GetSamples() {
				k := c.ks[j]
				b.out[k], b.got[k] = fromPB(s, b.epoch), true
				b.out[k].Request = b.is[k]
			}
		}
		n.keepPrefetched(c, b.epoch, back)
		if c.done != nil {
			for _, i := range c.window {
				delete(n.pending, n.slot(i))
			}
			close(c.done)
			n.reserved -= c.free
		}
		first = cmp.Or(first, c.err)
	}
	return first
}

// keepPrefetched puts what c's owner prefetched into the remote memory, a
// sample per offered slot; the rest goes into back, the owner's again.
// n.mu is held.
func (n *Node) keepPrefetched(c *fetch, epoch uint64, back map[int][]loader.Sample) {
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
}

// undo unissues a failed batch's requests and puts what they got into
// back, for their owners. n.mu is held.
func (n *Node) undo(b *batch, back map[int][]loader.Sample) {
	for k, i := range b.is {
		n.unissue(i)
		if b.got[k] {
			o := n.owner(b.out[k].Position)
			back[o] = append(back[o], b.out[k])
		}
	}
}
