package loader

// bitset is a set of small non-negative integers, 64 to a word.
type bitset []uint64

func newBitset(n int) bitset { return make(bitset, (n+63)/64) }

func (b bitset) has(i int) bool { return b[i/64]&(1<<(i%64)) != 0 }
func (b bitset) set(i int)      { b[i/64] |= 1 << (i % 64) }
func (b bitset) unset(i int)    { b[i/64] &^= 1 << (i % 64) }

// bytes returns the set as a bitmap of n bits, bit i of byte i/8 (the
// form a saved state stores).
func (b bitset) bytes(n int) []byte {
	out := make([]byte, (n+7)/8)
	for i := range out {
		out[i] = byte(b[i/8] >> (8 * (i % 8)))
	}
	return out
}

// bitsetOf reads a bitmap of n bits written by bytes; false when its
// length is not (n+7)/8 or a bit at n or above is set.
func bitsetOf(p []byte, n int) (bitset, bool) {
	if len(p) != (n+7)/8 {
		return nil, false
	}
	b := newBitset(n)
	for i, v := range p {
		b[i/8] |= uint64(v) << (8 * (i % 8))
	}
	if r := n % 64; r != 0 && b[len(b)-1]>>r != 0 {
		return nil, false
	}
	return b, true
}
