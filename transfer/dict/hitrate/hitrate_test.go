package hitrate

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHitRateReport(t *testing.T) {
	rep, err := Run(Config{Dir: t.TempDir(), Sizes: 3, MaxSize: 64 << 10, Iterations: 3, Repeat: 1, Write: []string{"posix", "direct"}, Read: []string{"posix", "mmap"}})
	require.NoError(t, err)
	assert.Equal(t, 9, rep.Transfers)
	strategies := map[string]bool{}
	for _, r := range rep.Results {
		strategies[r.Strategy+" "+r.Direction] = true
		assert.Greater(t, r.HitRate, 0.0)
		assert.LessOrEqual(t, r.OracleSeconds, r.ChosenSeconds+1e-12, "%s %s", r.Strategy, r.Direction)
	}
	assert.True(t, strategies["aware write"] && strategies["aware read"] && strategies["tool:mmap read"])
	assert.NotEmpty(t, rep.Buckets)
	assert.NotEmpty(t, rep.Dictionaries.Write)
}

func TestWorkloadSizesAndBudget(t *testing.T) {
	cfg := Config{Sizes: 4, MinSize: 4 << 10, MaxSize: 1 << 20, Iterations: 10, Budget: 3 << 20}.withDefaults()
	sizes, iters := cfg.workload()
	require.Len(t, sizes, 4)
	var sum int64
	for i, s := range sizes {
		assert.Zero(t, s%4, "whole float32s")
		assert.GreaterOrEqual(t, s, int64(3<<10), "at most 25%% below the log-spaced size")
		if i > 0 {
			assert.Greater(t, s, sizes[i-1], "log-spaced, increasing")
		}
		sum += s
	}
	assert.LessOrEqual(t, int64(len(iters))*sum, cfg.Budget, "fewer iterations over the budget")
	assert.Greater(t, len(iters), 1)
	for _, it := range iters {
		assert.ElementsMatch(t, []int{0, 1, 2, 3}, it, "every size once per iteration")
	}
}

func TestRunRefusesMmapWrites(t *testing.T) {
	_, err := Run(Config{Dir: t.TempDir(), Write: []string{"mmap"}, Read: []string{"posix"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "mmap cannot write")
}
