package loader

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// The limit follows the open servers' budgets and goes back to what it was
// when the last closes; a lower limit the process set is kept.
func TestMemoryLimitFollowsTheBudgets(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })

	debug.SetMemoryLimit(math.MaxInt64)
	HoldBudget(1 << 30)
	require.Equal(t, int64(1<<30+1<<27+limitSlack), debug.SetMemoryLimit(-1))
	HoldBudget(1 << 30)
	require.Equal(t, int64(2<<30+2<<27+limitSlack), debug.SetMemoryLimit(-1), "two servers: both budgets")
	HoldBudget(-(1 << 30))
	HoldBudget(-(1 << 30))
	require.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1), "the last closed: as before")

	debug.SetMemoryLimit(512 << 20) // GOMEMLIMIT=512MiB
	HoldBudget(1 << 30)
	require.Equal(t, int64(512<<20), debug.SetMemoryLimit(-1), "a lower limit of the process's is kept")
	HoldBudget(-(1 << 30))
	require.Equal(t, int64(512<<20), debug.SetMemoryLimit(-1))
}
