package gds

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"golang.org/x/sys/unix"
)

// Populate maps pages and changes no byte, inside p or next to it, for
// any slice: empty, within one page, unaligned at both ends.
func TestPopulateKeepsEveryByte(t *testing.T) {
	m, err := unix.Mmap(-1, 0, 5*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		t.Skip("no anonymous mapping:", err)
	}
	defer unix.Munmap(m)
	for i := range m {
		if i%3 == 0 {
			m[i] = byte(i)
		}
	}
	want := append([]byte(nil), m...)
	for _, write := range []bool{false, true} {
		Populate(m[:0], write)
		Populate(m[10:20], write)
		Populate(m[100:3*4096+5], write)
		Populate(m, write)
		assert.Equal(t, want, m)
	}
}
