package gds

import (
	"testing"
	"unsafe"

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

// mapped tells a page never touched from one written to.
func TestMappedSeesWrittenPages(t *testing.T) {
	m, err := unix.Mmap(-1, 0, 2*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		t.Skip("no anonymous mapping:", err)
	}
	defer unix.Munmap(m)
	lo := uintptr(unsafe.Pointer(&m[0]))
	assert.False(t, mapped(lo, 4096))
	m[1] = 1
	assert.True(t, mapped(lo, 4096))
	assert.False(t, mapped(lo+4096, 4096))
	Populate(m[4096:], true)
	assert.True(t, mapped(lo+4096, 4096))
}
