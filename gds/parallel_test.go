package gds

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSplitRunReportsUnbrokenRun(t *testing.T) {
	boom := errors.New("boom")
	n, err := splitRun(100, 10, 4, func(lo, hi int) (int, error) {
		if lo == 50 {
			return 3, boom
		}
		return hi - lo, nil
	})
	require.ErrorIs(t, err, boom)
	assert.Equal(t, 53, n)
}

func TestSplitRunWorkerPanicIsAnError(t *testing.T) {
	n, err := splitRun(100, 10, 4, func(lo, hi int) (int, error) {
		if lo == 30 {
			panic("worker bug")
		}
		return hi - lo, nil
	})
	require.ErrorIs(t, err, ErrInternal)
	assert.Contains(t, err.Error(), "worker bug")
	assert.Equal(t, 30, n)
}
