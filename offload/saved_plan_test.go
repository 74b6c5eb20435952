package offload

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// savedTrace is the trace pyfastensor.offload(policy="planned") builds from
// a profiling step (pyfastensor/offload/_planned.py): n saved tensors, each
// written by the forward op that saved it and read by the backward node that
// unpacks it, in reverse order, every op taking opNs.
func savedTrace(sizes []int64, opNs int64) *Trace {
	t := &Trace{Version: 1}
	t.Ops = append(t.Ops, TraceOp{Name: "fwd.start", TimeNs: opNs})
	for i, b := range sizes {
		t.Tensors = append(t.Tensors, TraceTensor{ID: i, Bytes: b, Kind: KindActivation})
		t.Ops = append(t.Ops, TraceOp{Name: fmt.Sprintf("fwd.pack%d", i), TimeNs: opNs, Writes: []int{i}})
	}
	t.Ops = append(t.Ops, TraceOp{Name: "bwd.start"})
	for i := len(sizes) - 1; i >= 0; i-- {
		t.Ops = append(t.Ops, TraceOp{Name: fmt.Sprintf("bwd.node%d", len(sizes)-1-i), TimeNs: opNs, Reads: []int{i}})
	}
	return t
}

// The run-time policy relies on these properties of MakePlan over such a
// trace: nothing moves when the saved tensors fit; otherwise each saved
// tensor has at most one migration, evicted after its own pack and
// prefetched after that, no later than the node that unpacks it; the
// planned peak stays within the budget; without host memory every
// migration goes to the SSD.
func TestPlanOverSavedTensors(t *testing.T) {
	sizes := []int64{4 << 20, 4 << 20, 2 << 20, 8 << 20, 1 << 20, 4 << 20, 4 << 20, 2 << 20}
	var demand int64
	for _, b := range sizes {
		demand += b
	}
	hw := Hardware{SSDReadBps: 2e9, SSDWriteBps: 1e9, HostLinkBps: 10e9}
	n := len(sizes)
	packOp := func(i int) int { return 1 + i }
	unpackOp := func(i int) int { return 2 + n + (n - 1 - i) }

	hw.DeviceBytes = demand
	p, err := MakePlan(savedTrace(sizes, 1_000_000), hw)
	require.NoError(t, err)
	assert.Empty(t, p.Migrations)
	assert.Equal(t, demand, p.DemandBytes)

	for _, tc := range []struct {
		capB  int64
		host  int64
		opNs  int64
		tiers map[string]bool
	}{
		{demand / 2, 0, 1_000_000, map[string]bool{TierSSD: true}},
		{8 << 20, 0, 1_000_000, map[string]bool{TierSSD: true}},
		{demand / 2, 1 << 30, 600_000, map[string]bool{TierSSD: true, TierHost: true}}, // the SSD saturates
		// No window hides a transfer: the ops wait for them, so the faster link.
		{demand / 2, 1 << 30, 10_000, map[string]bool{TierHost: true}},
	} {
		hw.DeviceBytes, hw.HostBytes = tc.capB, tc.host
		tr := savedTrace(sizes, tc.opNs)
		p, err := makePlan(tr, hw, TierSSD) // G10's own plan: the SSD first
		require.NoError(t, err, "capacity %d", tc.capB)
		best, err := MakePlan(tr, hw)
		require.NoError(t, err)
		assert.LessOrEqual(t, Simulate(tr, hw, &best).TimeNs, Simulate(tr, hw, &p).TimeNs)
		assert.LessOrEqual(t, p.PeakBytes, tc.capB)
		require.NotEmpty(t, p.Migrations)
		seen := map[int]bool{}
		tiers := map[string]bool{}
		for _, m := range p.Migrations {
			assert.False(t, seen[m.Tensor], "tensor %d migrated twice", m.Tensor)
			seen[m.Tensor] = true
			tiers[m.Tier] = true
			assert.Equal(t, packOp(m.Tensor), m.EvictAfter, "tensor %d", m.Tensor)
			assert.Equal(t, unpackOp(m.Tensor), m.Need, "tensor %d", m.Tensor)
			assert.Greater(t, m.PrefetchAt, m.EvictAfter, "tensor %d", m.Tensor)
			assert.LessOrEqual(t, m.PrefetchAt, m.Need, "tensor %d", m.Tensor)
			assert.False(t, m.Wraps)
		}
		assert.Equal(t, tc.tiers, tiers, "capacity %d, host %d", tc.capB, tc.host)
	}

	hw.DeviceBytes, hw.HostBytes = 8<<20-1, 0
	_, err = MakePlan(savedTrace(sizes, 1_000_000), hw)
	require.ErrorIs(t, err, ErrInfeasible)
	assert.Contains(t, err.Error(), `"fwd.pack3"`)
}
