package loader

import (
	"math/bits"
	"math/rand/v2"
)

// The package's random streams, frozen: a pack's order and a server's
// tie-breaks must not change when math/rand/v2 changes how its methods
// (Shuffle, IntN) turn the generator's outputs into numbers. The
// generator is PCG (math/rand/v2's PCG-DXSM, a fixed algorithm); the
// mapping to a range is ours, below.

// Stream selectors: the second PCG seed word, so that a pack's shuffle and
// a server's tie-breaks with equal seeds are unrelated streams.
const (
	packStream = 0x5046_5450_4143_4b31 // "PFTPACK1"
	tieStream  = 0x5046_5454_4945_3031 // "PFTTIE01"
)

// stream is a PCG with a count of the outputs drawn from it (its
// position, which a saved server state records).
type stream struct {
	pcg   *rand.PCG
	draws uint64
}

func newStream(seed, selector uint64) *stream {
	return &stream{pcg: rand.NewPCG(seed, selector)}
}

// uint64 draws one output.
func (s *stream) uint64() uint64 {
	s.draws++
	return s.pcg.Uint64()
}

// skip draws n outputs and drops them: the stream at position n.
func (s *stream) skip(n uint64) {
	for range n {
		s.uint64()
	}
}

// uniform returns a number in [0, n), n > 0, uniformly: Lemire's
// multiply-shift, rejecting the few outputs that would bias it.
func (s *stream) uniform(n uint64) uint64 {
	thresh := -n % n // 2^64 mod n
	for {
		hi, lo := bits.Mul64(s.uint64(), n)
		if lo >= thresh {
			return hi
		}
	}
}

// shuffled returns the positions 0..n-1 in the order a Fisher-Yates
// shuffle seeded by seed gives: the pack's order.
func shuffled(n int, seed uint64) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	s := newStream(seed, packStream)
	for i := n - 1; i > 0; i-- {
		j := int(s.uniform(uint64(i + 1)))
		order[i], order[j] = order[j], order[i]
	}
	return order
}
