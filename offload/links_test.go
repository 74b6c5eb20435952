package offload

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestTimeline(t *testing.T) {
	var l timeline
	got, end := l.forward(10, 5)
	assert.Equal(t, []span{{10, 15}}, got)
	assert.InDelta(t, 15, end, 1e-9)
	l.reserve(got)
	got, start := l.backward(30, 5)
	assert.Equal(t, []span{{25, 30}}, got)
	assert.InDelta(t, 25, start, 1e-9)
	l.reserve(got)
	assert.Equal(t, []span{{10, 15}, {25, 30}}, l.busy)
	// Forward from 12: waits out [12, 15), fills [15, 25), waits out [25, 30), ends at 32.
	got, end = l.forward(12, 12)
	assert.Equal(t, []span{{15, 25}, {30, 32}}, got)
	assert.InDelta(t, 32, end, 1e-9)
	// Backward to 28: [25, 28) is busy, fills [15, 25), then [5, 10) before [10, 15).
	got, start = l.backward(28, 15)
	assert.Equal(t, []span{{15, 25}, {5, 10}}, got)
	assert.InDelta(t, 5, start, 1e-9)
	l.reserve(got)
	assert.Equal(t, []span{{5, 30}}, l.busy) // merged
	_, end = l.forward(0, 10)
	assert.InDelta(t, 35, end, 1e-9) // [0, 5) then [30, 35)
}
