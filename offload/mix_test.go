package offload

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/gds"
)

// mixLayers is a transformer-like step of layers: per layer, forward packs
// a block input (expensive to make again: a matmul), a pointwise output
// (cheap), a norm output (cheap) and a big attention-core output
// (moderate); backward unpacks them in reverse, layer by layer.
func mixLayers(layers int, link MixLink) *MixInput {
	in := &MixInput{HookNs: 1_000, Tiers: map[string]MixLink{"host": link}}
	type kind struct {
		bytes, recompute int64
		fwd              int64
	}
	kinds := []kind{
		{4 << 20, -1, 400_000},       // block input: kept or moved only
		{8 << 20, 20_000, 100_000},   // pointwise output
		{4 << 20, 30_000, 60_000},    // norm output
		{16 << 20, 300_000, 500_000}, // attention core
	}
	for l := 0; l < layers; l++ {
		for k, kd := range kinds {
			t := MixTensor{Bytes: kd.bytes, Pack: len(in.ComputeNs), Move: true, RecomputeNs: kd.recompute}
			if k > 0 && kd.recompute >= 0 {
				t.Sources = []int{len(in.Tensors) - 1}
			}
			in.Tensors = append(in.Tensors, t)
			in.ComputeNs = append(in.ComputeNs, kd.fwd)
		}
	}
	in.Backward = len(in.ComputeNs)
	// Backward: one event per tensor, in reverse, twice forward's compute.
	for i := len(in.Tensors) - 1; i >= 0; i-- {
		in.Tensors[i].Uses = []int{len(in.ComputeNs)}
		in.ComputeNs = append(in.ComputeNs, 2*in.ComputeNs[in.Tensors[i].Pack])
	}
	return in
}

var pcie = MixLink{WriteBps: 20e9, ReadBps: 20e9}

func TestPlanMixKeepsEverythingWithoutABudget(t *testing.T) {
	in := mixLayers(4, pcie)
	p, err := PlanMix(in)
	require.NoError(t, err)
	var total int64
	for _, tn := range in.Tensors {
		total += tn.Bytes
	}
	assert.Equal(t, total, p.Peak, "every saved tensor alive at the end of forward")
	assert.Equal(t, MixClass{Tensors: len(in.Tensors), Bytes: total}, p.Classes[MixKeep])
	var compute int64
	for _, ns := range in.ComputeNs {
		compute += ns
	}
	assert.Equal(t, compute, p.StepNs)
	assert.Equal(t, p.Frontier[0], MixPoint{0, compute, total})
}

func TestPlanMixPeakIsNonIncreasingAsTheBudgetDrops(t *testing.T) {
	in := mixLayers(6, pcie)
	full, err := PlanMix(in)
	require.NoError(t, err)
	assertPeakFallsWithTheBudget(t, in, full.Peak, full.MinBudget, 40)
	assert.Less(t, full.MinBudget, full.Peak/2, "the mix frees more than half of the saved bytes")
}

func TestPlanMixRefusesABudgetBelowAnyMixNamingTheSmallest(t *testing.T) {
	in := mixLayers(3, pcie)
	in.Budget = 1
	_, err := PlanMix(in)
	require.ErrorIs(t, err, ErrMixInfeasible)
	require.ErrorIs(t, err, gds.ErrInvalid)
	in.Budget = 0
	p, err := PlanMix(in)
	require.NoError(t, err)
	assert.Contains(t, err2str(PlanMixAt(in, 1)), "smallest feasible budget is "+itoa(p.MinBudget)+" bytes")
	in.Budget = p.MinBudget
	q, err := PlanMix(in)
	require.NoError(t, err)
	assert.LessOrEqual(t, q.Peak, p.MinBudget)
}

// PlanMixAt plans in at a budget, for the error's text.
func PlanMixAt(in *MixInput, budget int64) error {
	c := *in
	c.Budget = budget
	_, err := PlanMix(&c)
	return err
}

func err2str(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func itoa(v int64) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestPlanMixRecomputesCheapTensorsWhereTheLinkIsSlowAndMovesWhereItIsFast(t *testing.T) {
	slow := mixLayers(4, MixLink{WriteBps: 0.5e9, ReadBps: 0.5e9})
	full, err := PlanMix(slow)
	require.NoError(t, err)
	slow.Budget = full.Peak * 3 / 4
	p, err := PlanMix(slow)
	require.NoError(t, err)
	assert.Positive(t, p.Classes[MixRecompute].Tensors, "a slow link: recompute the cheap ones")
	assert.Zero(t, p.Classes["host"].Tensors, "moving at 0.5 GB/s costs more than recomputing")

	fast := mixLayers(4, MixLink{WriteBps: 1e12, ReadBps: 1e12})
	fast.Budget = slow.Budget
	q, err := PlanMix(fast)
	require.NoError(t, err)
	assert.Positive(t, q.Classes["host"].Tensors, "a link that hides every transfer: move")
	assert.LessOrEqual(t, q.StepNs, p.StepNs)
}

func TestPlanMixRecomputesFromRecomputedSourcesAndChargesTheirTime(t *testing.T) {
	// a (kept only) -> b (recomputable from a) -> c (recomputable from b); no tier.
	in := &MixInput{
		Tensors: []MixTensor{
			{Bytes: 100, Pack: 0, Uses: []int{5}, RecomputeNs: -1},
			{Bytes: 100, Pack: 1, Uses: []int{4}, RecomputeNs: 10, Sources: []int{0}},
			{Bytes: 100, Pack: 2, Uses: []int{3}, RecomputeNs: 20, Sources: []int{1}},
		},
		ComputeNs: []int64{1, 1, 1, 1, 1, 1}, Backward: 3,
	}
	sim := newMixModel(in).simulate([]int{actKeep, actRecompute, actRecompute}, 0)
	// c's recompute needs b first (made at c's use, event 3): both times charged once.
	assert.Equal(t, int64(6+10+20), sim.stepNs)
	assert.Equal(t, int64(300), sim.peak, "a, b and c together at c's use")
	in.Budget = 200
	p, err := PlanMix(in)
	require.NoError(t, err)
	assert.LessOrEqual(t, p.Peak, int64(200))
}

func TestPlanMixHoldsAKeptSourceUntilItsRecomputedTensorsLastUse(t *testing.T) {
	// a (kept or moved) is read at event 2; b, recomputed from a, at events 3 and 5: the recipe
	// bound to a kept a holds it until b's last use; a moved a is read back for b's recompute
	// and held until then.
	in := &MixInput{
		Tensors: []MixTensor{
			{Bytes: 100, Pack: 0, Uses: []int{2}, Move: true, RecomputeNs: -1},
			{Bytes: 10, Pack: 1, Uses: []int{3, 5}, RecomputeNs: 1, Sources: []int{0}},
		},
		ComputeNs: []int64{1, 1, 1, 1, 1, 1}, Backward: 2,
		Tiers: map[string]MixLink{"host": pcie},
	}
	m := newMixModel(in)
	m.plan([]int{actKeep, actRecompute})
	assert.Equal(t, 5, m.last[0], "kept: until b's last use")
	assert.True(t, m.aliveAt(0, actKeep, 4))
	m.plan([]int{actTier, actRecompute})
	assert.Equal(t, 3, m.last[0], "moved: until b is made")
	assert.Equal(t, int64(110), m.simulate([]int{actKeep, actRecompute}, 0).peak)
}

func TestPlanMixCountsAMovedTensorUntilItsWriteEndsAndWaitsForItsRead(t *testing.T) {
	in := &MixInput{
		Tensors:   []MixTensor{{Bytes: 1e9, Pack: 0, Uses: []int{1}, Move: true, RecomputeNs: -1}},
		ComputeNs: []int64{1_000_000, 1_000_000}, Backward: 1,
		Tiers: map[string]MixLink{"host": {WriteBps: 1e9, ReadBps: 1e9}},
	}
	sim := newMixModel(in).simulate([]int{actTier}, 0)
	// 1 s to write, 1 s to read, against 2 ms of compute: the step waits for both.
	assert.Equal(t, int64(2_000_000_000+1_000_000), sim.stepNs)
	assert.Equal(t, int64(1e9), sim.peak)
}

func TestPlanMixValidatesItsInput(t *testing.T) {
	good := func() *MixInput { return mixLayers(1, pcie) }
	for name, spoil := range map[string]func(*MixInput){
		"backward out of range": func(in *MixInput) { in.Backward = len(in.ComputeNs) + 1 },
		"negative compute":      func(in *MixInput) { in.ComputeNs[0] = -1 },
		"pack in backward":      func(in *MixInput) { in.Tensors[0].Pack = in.Backward },
		"use in forward":        func(in *MixInput) { in.Tensors[0].Uses = []int{0} },
		"uses not ascending":    func(in *MixInput) { in.Tensors[0].Uses = []int{in.Backward + 1, in.Backward} },
		"later source":          func(in *MixInput) { in.Tensors[0].Sources = []int{1} },
		"self source":           func(in *MixInput) { in.Tensors[1].Sources = []int{1} },
		"recompute time":        func(in *MixInput) { in.Tensors[0].RecomputeNs = -2 },
		"tier bandwidth":        func(in *MixInput) { in.Tiers["host"] = MixLink{} },
		"negative bytes":        func(in *MixInput) { in.Tensors[0].Bytes = -1 },
	} {
		in := good()
		spoil(in)
		_, err := PlanMix(in)
		require.ErrorIs(t, err, gds.ErrInvalid, name)
	}
}

func TestPlanMixOfAFortyEightLayerStep(t *testing.T) {
	in := mixLayers(48, pcie)
	full, err := PlanMix(in)
	require.NoError(t, err)
	in.Budget = (full.Peak + full.MinBudget) / 2
	p, err := PlanMix(in)
	require.NoError(t, err)
	assert.LessOrEqual(t, p.Peak, in.Budget)
	assert.Len(t, p.Decisions, 48*4)
}

func BenchmarkPlanMixFortyEightLayers(b *testing.B) {
	in := mixLayers(48, pcie)
	full, err := PlanMix(in)
	require.NoError(b, err)
	in.Budget = full.MinBudget
	b.ResetTimer()
	for range b.N {
		if _, err := PlanMix(in); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzPlanMix(f *testing.F) {
	seed, _ := json.Marshal(mixLayers(2, pcie))
	f.Add(seed, int64(0))
	f.Add(seed, int64(1))
	f.Add([]byte(`{"tensors":[{"bytes":5,"pack":0,"uses":[1],"move":true,"recompute_ns":3}],"compute_ns":[1,1],"backward":1,"tiers":{"ssd":{"write_bps":1,"read_bps":1}}}`), int64(4))
	f.Add([]byte(`{"tensors":[{"bytes":5,"pack":0,"uses":[1],"move":true,"recompute_ns":-1}],"compute_ns":[1,1],"backward":1,"tiers":{"ssd":{"write_bps":1,"read_bps":1}},"actions":["ssd-on-demand"]}`), int64(4))
	f.Fuzz(func(t *testing.T, data []byte, budget int64) {
		var in MixInput
		if json.Unmarshal(data, &in) != nil || len(in.Tensors) > 64 || len(in.ComputeNs) > 256 {
			return
		}
		for _, tn := range in.Tensors {
			if tn.Bytes > 1<<40 || tn.TempBytes > 1<<40 || tn.RecomputeNs > 1<<40 {
				return
			}
		}
		for _, ns := range in.ComputeNs {
			if ns > 1<<40 {
				return
			}
		}
		in.Budget = budget
		p, err := PlanMix(&in)
		if err != nil {
			return
		}
		if budget > 0 && p.Peak > budget && in.Actions == nil {
			t.Fatalf("peak %d over budget %d", p.Peak, budget)
		}
		if len(p.Decisions) != len(in.Tensors) {
			t.Fatalf("%d decisions for %d tensors", len(p.Decisions), len(in.Tensors))
		}
	})
}

// mixChain is a forward of four 100-byte tensors a nanosecond apart and a
// backward that unpacks them in reverse, over a link that writes and reads
// a byte a nanosecond: no write ends before the forward does.
func mixChain() *MixInput {
	in := &MixInput{ComputeNs: []int64{1, 1, 1, 1, 1, 1, 1, 1}, Backward: 4,
		Tiers: map[string]MixLink{"ssd": {WriteBps: 1e9, ReadBps: 1e9}}}
	for i := 0; i < 4; i++ {
		in.Tensors = append(in.Tensors, MixTensor{Bytes: 100, Pack: i, Uses: []int{7 - i}, Move: true, RecomputeNs: -1})
	}
	return in
}

func TestPlanMixWaitsForWritesWhereTheLinkIsSlowerThanTheForward(t *testing.T) {
	in := mixChain()
	full, err := PlanMix(in)
	require.NoError(t, err)
	for _, p := range full.Frontier {
		assert.Equal(t, int64(400), p.Peak, "without waits every moved tensor is still being written at the peak")
	}
	assert.Equal(t, int64(100), full.MinBudget, "waiting for each write, one tensor at a time")
	in.Budget = 100
	p, err := PlanMix(in)
	require.NoError(t, err)
	assert.LessOrEqual(t, p.Peak, int64(100))
	// The last packed, unpacked first, is kept; the others are written while the next pack waits
	// for each, and read back one at a time.
	moved := p.Classes["ssd"].Tensors + p.Classes["ssd"+MixOnDemand].Tensors
	assert.Equal(t, 3, moved)
	assert.Equal(t, int64(300), p.Classes["ssd"].Bytes+p.Classes["ssd"+MixOnDemand].Bytes)
	assert.Equal(t, int64(3*99), p.WaitNs, "three packs wait for the write before them")
	assert.GreaterOrEqual(t, p.StepNs, int64(600), "three writes and three reads, one after another")
	in.Budget = 250
	q, err := PlanMix(in)
	require.NoError(t, err)
	assert.LessOrEqual(t, q.Peak, int64(250))
	assert.Less(t, q.StepNs, p.StepNs, "a larger budget waits less")
	assert.Contains(t, err2str(PlanMixAt(in, 99)), "smallest feasible budget is 100 bytes")
}

func TestPlanMixPeakIsNonIncreasingAsTheBudgetDropsThroughTheWaits(t *testing.T) {
	in := mixLayers(6, MixLink{WriteBps: 0.05e9, ReadBps: 0.05e9}) // slower than the forward makes them
	for i := range in.Tensors {
		in.Tensors[i].RecomputeNs, in.Tensors[i].Sources = -1, nil // moves only
	}
	full, err := PlanMix(in)
	require.NoError(t, err)
	lowest := full.Frontier[0].Peak
	for _, p := range full.Frontier {
		lowest = min(lowest, p.Peak)
	}
	require.Less(t, full.MinBudget, lowest, "waits reach below the frontier")
	assertPeakFallsWithTheBudget(t, in, lowest, full.MinBudget, 60)
}

// assertPeakFallsWithTheBudget plans in at budgets from top down to low in
// steps: each is met, and no peak is above the one of a larger budget.
func assertPeakFallsWithTheBudget(t *testing.T, in *MixInput, top, low int64, steps int64) {
	t.Helper()
	prev := top
	for b := top; b >= low; b -= (top - low) / steps {
		in.Budget = b
		p, err := PlanMix(in)
		require.NoError(t, err, "budget %d", b)
		assert.LessOrEqual(t, p.Peak, b)
		assert.LessOrEqual(t, p.Peak, prev, "budget %d", b)
		prev = p.Peak
	}
}

func TestPlanMixSimulatesGivenActionsInsteadOfChoosing(t *testing.T) {
	in := mixChain()
	in.Budget = 100
	chosen, err := PlanMix(in)
	require.NoError(t, err)
	for _, d := range chosen.Decisions {
		in.Actions = append(in.Actions, d.Action)
	}
	in.ComputeNs[0] *= 50 // the profile calibrated: the first pack's compute now takes 50 ns
	p, err := PlanMix(in)
	require.NoError(t, err)
	for i, d := range p.Decisions {
		assert.Equal(t, in.Actions[i], d.Action)
	}
	assert.Equal(t, chosen.WaitNs-49, p.WaitNs, "the second pack waits 49 ns less for the first write")
	assert.Equal(t, chosen.StepNs, p.StepNs, "the writes still bound the forward")
	in.Budget = 1 // not refused: the actions are the plan
	_, err = PlanMix(in)
	require.NoError(t, err)
	for name, actions := range map[string][]string{
		"length":     {"keep"},
		"unknown":    {"keep", "keep", "keep", "disk"},
		"recompute":  {"keep", "keep", "keep", MixRecompute},
		"other tier": {"keep", "keep", "keep", "host"},
	} {
		in.Actions = actions
		_, err := PlanMix(in)
		require.ErrorIs(t, err, gds.ErrInvalid, name)
	}
}
