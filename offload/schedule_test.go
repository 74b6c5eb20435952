package offload

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mib(n int64) int64 { return n << 20 }

func profile(budget, forwardNs int64, ts ...Tensor) Profile {
	for i := range ts {
		ts[i].Index = i
	}
	return Profile{Tensors: ts, ForwardNs: forwardNs, Budget: budget}
}

func offloaded(p Plan) map[int]string {
	out := map[int]string{}
	for _, d := range p.Decisions {
		if d.Offload {
			out[d.Index] = d.Codec
		}
	}
	return out
}

func TestNothingOffloadedWhenEverythingFits(t *testing.T) {
	p := Schedule(profile(mib(10), 1e6, Tensor{Size: mib(4), WriteNs: 1e6}, Tensor{Size: mib(4), WriteNs: 1e6}))
	assert.Empty(t, offloaded(p))
	assert.True(t, p.FitsBudget)
	assert.Equal(t, 1, p.Phase)
	assert.EqualValues(t, mib(8), p.ResidentBytes)
}

func TestLinearSelectionTakesEarliestTensorsFirst(t *testing.T) {
	ts := []Tensor{{Size: mib(4), WriteNs: 1e6}, {Size: mib(4), WriteNs: 1e6}, {Size: mib(4), WriteNs: 1e6}}
	p := Schedule(profile(mib(5), 1e9, ts...))
	assert.Equal(t, map[int]string{0: "raw", 1: "raw"}, offloaded(p))
	assert.Equal(t, 1, p.Phase, "transfers (2 ms) hide behind the forward pass (1 s)")
	assert.EqualValues(t, mib(4), p.ResidentBytes)
	assert.InDelta(t, 500, p.Overlap, 1)
}

func TestCompressionAwarePhaseCompressesBestRatioFirst(t *testing.T) {
	ts := []Tensor{
		{Size: mib(4), WriteNs: 4e6, Ratios: map[string]float64{"fp16": 2}},
		{Size: mib(4), WriteNs: 4e6, Ratios: map[string]float64{"sparse": 4, "fp16": 2}, Relu: true},
		{Size: mib(4), WriteNs: 4e6},
	}
	// Offloading all three takes 12 ms raw; the forward pass is 10 ms.
	p := Schedule(profile(0, 10e6, ts...))
	require.Equal(t, 2, p.Phase)
	assert.Equal(t, map[int]string{0: "raw", 1: "sparse", 2: "raw"}, offloaded(p))
	assert.EqualValues(t, 9e6, p.TransferNs)
	assert.GreaterOrEqual(t, p.Overlap, 1.0)
	assert.Contains(t, p.Text, "sparse")
	assert.Contains(t, p.Text, "#1       4.00 MiB  offload to ssd  sparse")
}

func TestCodecThatCostsMoreThanItSavesIsNotUsed(t *testing.T) {
	ts := []Tensor{
		// Sparse halves a 4 ms write (saves 2 ms) but costs 3 ms of compute.
		{Size: mib(4), WriteNs: 4e6, Ratios: map[string]float64{"sparse": 2}, CodecNs: map[string]int64{"sparse": 3e6}, Relu: true},
		// Here it saves 3 ms for 1 ms of compute.
		{Size: mib(4), WriteNs: 4e6, Ratios: map[string]float64{"sparse": 4}, CodecNs: map[string]int64{"sparse": 1e6}, Relu: true},
	}
	p := Schedule(profile(0, 1e6, ts...))
	assert.Equal(t, map[int]string{0: "raw", 1: "sparse"}, offloaded(p))
	assert.Contains(t, p.Text, "outlast")
}

func TestPlanNamesTheTier(t *testing.T) {
	pr := profile(0, 1e9, Tensor{Size: mib(4), WriteNs: 1e6})
	pr.Tier = "host"
	p := Schedule(pr)
	assert.Equal(t, "host", p.Tier)
	assert.Contains(t, p.Text, "offload to host raw")
}

func TestSwapBringsInCompressibleTensor(t *testing.T) {
	ts := []Tensor{
		{Size: mib(4), WriteNs: 4e6},
		{Size: mib(4), WriteNs: 4e6, Ratios: map[string]float64{"sparse": 4}},
	}
	// Budget 4 MiB: linear selection offloads tensor 0 (4 ms) but the
	// forward pass is 2 ms; tensor 1 compresses to 1 ms, so it goes instead.
	p := Schedule(profile(mib(4), 2e6, ts...))
	assert.Equal(t, map[int]string{1: "sparse"}, offloaded(p))
	assert.EqualValues(t, mib(4), p.ResidentBytes)
	assert.Empty(t, p.Notes)
}

func TestStallPredictedWhenNothingHelps(t *testing.T) {
	p := Schedule(profile(0, 1e6, Tensor{Size: mib(4), WriteNs: 4e6}))
	assert.Equal(t, map[int]string{0: "raw"}, offloaded(p))
	assert.Less(t, p.Overlap, 1.0)
	require.NotEmpty(t, p.Notes)
	assert.Contains(t, p.Text, "outlast")
}
