package gds

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestReleaseIdleUnmapsWhatIsIdleOnly(t *testing.T) {
	ReleaseIdle()
	a, giveA := Borrow(3 << 20) // two huge pages
	b, giveB := Borrow(1)       // one
	a[0], b[0] = 1, 2
	giveA()
	assert.Equal(t, 4<<20, ReleaseIdle(), "the idle buffer, in whole huge pages")
	assert.Equal(t, 0, ReleaseIdle())
	giveB() // in use during the release: pooled when given back
	assert.Equal(t, 2<<20, ReleaseIdle())
}
