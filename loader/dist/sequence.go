package dist

import (
	"fmt"
	"slices"

	"github.com/pyfastensor/pyfastensor/loader"
)

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
