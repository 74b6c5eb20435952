package offload

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const seedTrace = `{"version": 1,
 "tensors": [{"id": 0, "bytes": 4096, "kind": "weight"}, {"id": 3, "bytes": 100, "kind": "input"},
             {"id": 4, "bytes": 800, "kind": "activation"}, {"id": 5, "bytes": 800, "kind": "gradient"}],
 "ops": [{"name": "layer1.fwd", "time_ns": 12000, "reads": [0, 3], "writes": [4]},
         {"name": "loss", "time_ns": 1000, "reads": [], "writes": []},
         {"name": "layer1.bwd", "time_ns": 20000, "reads": [4, 0], "writes": [5]}]}`

// layered builds a forward and backward pass over L layers: layer i reads
// activation i-1 and weight i and writes activation i; backward reads the
// saved activation, the weight and the incoming gradient.
func layered(r *rand.Rand, layers int, actBytes, wBytes int64) *Trace {
	t := &Trace{Version: 1}
	id := 0
	add := func(b int64, kind string) int {
		t.Tensors = append(t.Tensors, TraceTensor{ID: id, Bytes: b, Kind: kind})
		id++
		return id - 1
	}
	jit := func(b int64) int64 {
		if r == nil {
			return b
		}
		return b/2 + r.Int63n(b)
	}
	in := add(jit(actBytes), KindInput)
	acts := []int{in}
	var ws []int
	for i := 0; i < layers; i++ {
		w := add(jit(wBytes), KindWeight)
		x := add(jit(actBytes), KindActivation)
		ws = append(ws, w)
		t.Ops = append(t.Ops, TraceOp{Name: fmt.Sprintf("l%d.fwd", i), TimeNs: jit(1_000_000),
			Reads: []int{acts[len(acts)-1], w}, Writes: []int{x}})
		acts = append(acts, x)
	}
	g := add(jit(actBytes), KindGradient)
	t.Ops = append(t.Ops, TraceOp{Name: "loss", TimeNs: jit(100_000), Reads: []int{acts[len(acts)-1]}, Writes: []int{g}})
	for i := layers - 1; i >= 0; i-- {
		g2 := add(jit(actBytes), KindGradient)
		gw := add(jit(wBytes), KindGradient)
		t.Ops = append(t.Ops, TraceOp{Name: fmt.Sprintf("l%d.bwd", i), TimeNs: jit(2_000_000),
			Reads: []int{acts[i], ws[i], g}, Writes: []int{g2, gw}})
		g = g2
	}
	return t
}

func FuzzParseTrace(f *testing.F) {
	f.Add([]byte(seedTrace))
	f.Add([]byte(`{"version": 1, "tensors": [], "ops": []}`))
	f.Add([]byte(`{"version": 2, "tensors": [], "ops": []}`))
	f.Add([]byte(`{"version": 1, "tensors": [{"id": 1, "bytes": 8, "kind": "workspace"}], "ops": [{"name": "a", "time_ns": 1, "reads": [1], "writes": [1]}]}`))
	b, err := layered(nil, 3, 1000, 100).Marshal()
	require.NoError(f, err)
	f.Add(b)
	f.Add([]byte(`{"version": 1, "tensors": [], "ops": [], "meta": {"op_time": "cpu", "n": [1, {}]}}`))
	f.Add([]byte(`{"version": 1, "tensors": [], "ops": [], "meta": {}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := ParseTrace(data)
		if err != nil {
			if !errors.Is(err, ErrTrace) {
				t.Fatalf("error does not wrap ErrTrace: %v", err)
			}
			return
		}
		out, err := tr.Marshal()
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		tr2, err := ParseTrace(out)
		if err != nil {
			t.Fatalf("re-parse: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(tr, tr2) {
			t.Fatalf("round trip changed the trace:\n%+v\n%+v", tr, tr2)
		}
		Analyze(tr) // must not panic on any valid trace
	})
}

func TestParseTraceErrors(t *testing.T) {
	cases := map[string]string{
		`{"version": 2, "tensors": [], "ops": []}`: "version 2",
		`{"version": 1, "tensors": [{"id": 1, "bytes": 1, "kind": "weight"}, {"id": 1, "bytes": 1, "kind": "weight"}], "ops": []}`:     "tensor 1 (entry 1): duplicate id",
		`{"version": 1, "tensors": [{"id": 1, "bytes": 1, "kind": "blob"}], "ops": []}`:                                                "unknown kind \"blob\"",
		`{"version": 1, "tensors": [{"id": 1, "bytes": -1, "kind": "weight"}], "ops": []}`:                                             "negative size",
		`{"version": 1, "tensors": [], "ops": [{"name": "a", "time_ns": -5, "reads": [], "writes": []}]}`:                              "op 0 (\"a\"): negative time_ns",
		`{"version": 1, "tensors": [], "ops": [{"name": "a", "time_ns": 5, "reads": [7], "writes": []}]}`:                              "reads tensor 7, which the trace does not declare",
		`{"version": 1, "tensors": [{"id": 1, "bytes": 1, "kind": "activation"}], "ops": [{"name": "a", "time_ns": 5, "reads": [1]}]}`: "reads activation tensor 1 before any op writes it",
		`{"version": 1, "tensors": [], "ops": []} x`:                                                                                   "trailing data",
		`[1]`: "decoding JSON",
		`{"version": 1, "tensors": [{"id": 0, "size": 4096, "kind": "weight"}], "ops": []}`:                               `a tensor without "bytes": {"id": 0, "size": 4096`,
		`{"version": 1, "tensors": [{"bytes": 1}], "ops": []}`:                                                            `a tensor without "id" and "kind"`,
		`{"version": 1, "tensors": [], "ops": [{"name": "a", "ns": 5}]}`:                                                  `an op without "time_ns"`,
		`{"version": 1, "tensors": null, "ops": []}`:                                                                      `no "tensors" or no "ops" list`,
		`{"version": 1, "ops": []}`:                                                                                       `no "tensors" or no "ops" list`,
		`{"version": 1, "tensors": [], "ops": [{"name": "a", "time_ns": 9007199254740992}, {"name": "b", "time_ns": 1}]}`: `op 1 ("b"): total time_ns 9007199254740993 is over 2^53 ns`,
	}
	for in, want := range cases {
		_, err := ParseTrace([]byte(in))
		require.Error(t, err, in)
		assert.ErrorIs(t, err, ErrTrace)
		assert.Contains(t, err.Error(), want)
	}
	tr, err := ParseTrace([]byte(seedTrace))
	require.NoError(t, err)
	assert.Len(t, tr.Ops, 3)
}

func TestVitalityKnownPeriods(t *testing.T) {
	tr, err := ParseTrace([]byte(seedTrace))
	require.NoError(t, err)
	a := Analyze(tr)
	assert.Equal(t, int64(33000), a.TotalNs)

	w := a.Of(0)
	assert.True(t, w.Global)
	assert.Equal(t, []int{0, 2}, w.Uses)
	assert.Equal(t, 0, w.Birth)
	assert.Equal(t, 2, w.Death)
	require.Len(t, w.Periods, 1) // 0 and 2 with op 1 between; no wrap (used first and last)
	assert.Equal(t, InactivePeriod{Tensor: 0, Bytes: 4096, After: 0, Before: 2, Ops: []int{1}, StartNs: 12000, EndNs: 13000}, w.Periods[0])

	x := a.Of(4) // activation: written by op 0, read by op 2
	assert.False(t, x.Global)
	assert.Equal(t, 0, x.Birth)
	assert.Equal(t, 2, x.Death)
	require.Len(t, x.Periods, 1)
	assert.Equal(t, int64(1000), x.Periods[0].Ns())
	assert.Equal(t, int64(800), x.Periods[0].Bytes)

	in := a.Of(3) // input used only by op 0: wraps from op 0 to op 0 of the next iteration
	require.Len(t, in.Periods, 1)
	p := in.Periods[0]
	assert.True(t, p.Wraps)
	assert.Equal(t, []int{1, 2}, p.Ops)
	assert.Equal(t, int64(12000), p.StartNs)
	assert.Equal(t, int64(33000), p.EndNs)

	g := a.Of(5) // gradient written by the last op, never read
	assert.Equal(t, 2, g.Birth)
	assert.Equal(t, 2, g.Death)
	assert.Empty(t, g.Periods)

	assert.Equal(t, []int64{4096 + 100 + 800, 4096 + 100 + 800, 4096 + 100 + 800 + 800}, a.Pressure)
	assert.Equal(t, []int64{4096 + 100 + 800, 0, 800 + 4096 + 800}, a.OpBytes)
}

func TestVitalityMultiplePeriods(t *testing.T) {
	tr := &Trace{Version: 1,
		Tensors: []TraceTensor{{ID: 0, Bytes: 10, Kind: KindActivation}, {ID: 1, Bytes: 1, Kind: KindWorkspace}},
		Ops: []TraceOp{
			{Name: "w", TimeNs: 1, Writes: []int{0}},
			{Name: "a", TimeNs: 2, Writes: []int{1}},
			{Name: "r1", TimeNs: 3, Reads: []int{0}},
			{Name: "b", TimeNs: 4, Reads: []int{1}},
			{Name: "c", TimeNs: 5},
			{Name: "r2", TimeNs: 6, Reads: []int{0}},
		}}
	require.NoError(t, tr.Validate())
	a := Analyze(tr)
	ps := a.Of(0).Periods
	require.Len(t, ps, 2)
	assert.Equal(t, []int{1}, ps[0].Ops)
	assert.Equal(t, int64(1), ps[0].StartNs)
	assert.Equal(t, int64(3), ps[0].EndNs)
	assert.Equal(t, []int{3, 4}, ps[1].Ops)
	assert.Equal(t, int64(6), ps[1].StartNs)
	assert.Equal(t, int64(15), ps[1].EndNs)
	assert.Len(t, a.Of(1).Periods, 1)
	assert.Equal(t, []int{2}, a.Of(1).Periods[0].Ops)
}

func sumOps(t *Trace) int64 {
	var s int64
	for _, op := range t.Ops {
		s += op.TimeNs
	}
	return s
}

func TestIdealIsSumOfOpTimes(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 20; i++ {
		tr := layered(r, 2+r.Intn(10), 1<<20, 1<<18)
		hw := G10Default()
		hw.DeviceBytes = 1 // ideal ignores capacity
		res, err := SimulatePolicy(tr, hw, PolicyIdeal)
		require.NoError(t, err)
		assert.Equal(t, sumOps(tr), res.TimeNs)
		assert.Equal(t, sumOps(tr), res.IdealNs)
		assert.Zero(t, res.StallNs)
		assert.True(t, res.Feasible)
		assert.Equal(t, max64(Analyze(tr).Pressure), res.PeakDeviceBytes)
	}
}

func max64(xs []int64) int64 {
	var m int64
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// randomProblem returns a random layered trace and hardware for it: a
// device between the largest op and the peak demand, host memory below
// the peak; hi is the peak.
func randomProblem(r *rand.Rand) (*Trace, Hardware, int64) {
	tr := layered(r, 3+r.Intn(10), 1<<20+r.Int63n(16<<20), 1<<16+r.Int63n(4<<20))
	a := Analyze(tr)
	lo, hi := max64(a.OpBytes), max64(a.Pressure)
	hw := smallHW(lo + r.Int63n(hi-lo+1))
	hw.HostBytes = r.Int63n(hi)
	return tr, hw, hi
}

func smallHW(capB int64) Hardware {
	hw := G10Default()
	hw.DeviceBytes = capB
	hw.HostBytes = 1 << 40
	return hw
}

func TestPlanMovesNothingWithMemoryToSpare(t *testing.T) {
	tr := layered(nil, 6, 1<<20, 1<<18)
	a := Analyze(tr)
	p, err := MakePlan(tr, smallHW(max64(a.Pressure)))
	require.NoError(t, err)
	assert.Empty(t, p.Migrations)
	res := Simulate(tr, smallHW(max64(a.Pressure)), &p)
	assert.Equal(t, sumOps(tr), res.TimeNs)
	assert.Zero(t, res.SSDWriteBytes+res.HostWriteBytes)
}

func TestPlanInfeasible(t *testing.T) {
	tr := layered(nil, 4, 1<<20, 1<<18)
	capB := max64(Analyze(tr).OpBytes) - 1
	_, err := MakePlan(tr, smallHW(capB))
	require.ErrorIs(t, err, ErrInfeasible)
	assert.Contains(t, err.Error(), fmt.Sprintf("device capacity of %d bytes", capB))
	for _, pol := range []string{PolicyOnDemand, PolicyFlashNeuron, PolicyG10} {
		res, err := SimulatePolicy(tr, smallHW(capB), pol)
		require.NoError(t, err)
		assert.False(t, res.Feasible, pol)
		assert.Contains(t, res.Error, fmt.Sprint(capB), pol)
		assert.LessOrEqual(t, res.PeakDeviceBytes, capB, pol)
	}
}

func TestPlanNeverExceedsCapacity(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	for i := 0; i < 60; i++ {
		tr := layered(r, 2+r.Intn(12), 1<<20+r.Int63n(8<<20), 1<<16+r.Int63n(4<<20))
		a := Analyze(tr)
		lo, hi := max64(a.OpBytes), max64(a.Pressure)
		capB := lo + r.Int63n(hi-lo+1)
		hw := smallHW(capB)
		if r.Intn(3) == 0 {
			hw.HostBytes = r.Int63n(hi)
		}
		p, err := MakePlan(tr, hw)
		require.NoError(t, err)
		assert.LessOrEqual(t, p.PeakBytes, capB)
		assert.NotEmpty(t, p.String())
		for _, pol := range []string{PolicyOnDemand, PolicyFlashNeuron, PolicyG10} {
			res, err := SimulatePolicy(tr, hw, pol)
			require.NoError(t, err)
			assert.True(t, res.Feasible, "%s: %s", pol, res.Error)
			assert.LessOrEqual(t, res.PeakDeviceBytes, capB, pol)
			assert.GreaterOrEqual(t, res.TimeNs, sumOps(tr), pol)
		}
	}
}

// More device memory over a sweep of capacities, 20 traces of 9 steps:
// never slower a step up (the greedy planner alone was up to 2.83% slower,
// 3 times in 160 steps; the best of a grid of candidates that only grows
// with the capacity is not).
func TestMoreMemoryNeverSlower(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	for i := 0; i < 20; i++ {
		tr := layered(r, 4+r.Intn(8), 4<<20, 1<<20)
		a := Analyze(tr)
		lo, hi := max64(a.OpBytes), max64(a.Pressure)
		prev := int64(-1)
		for s := 0; s <= 8; s++ {
			capB := lo + (hi-lo)*int64(s)/8
			hw := smallHW(capB)
			hw.HostBytes = 0
			res, err := SimulatePolicy(tr, hw, PolicyG10)
			require.NoError(t, err)
			require.True(t, res.Feasible, res.Error)
			if prev >= 0 {
				assert.LessOrEqual(t, res.TimeNs, prev, "trace %d: capacity %d slower than the capacity below", i, capB)
			}
			prev = res.TimeNs
		}
		assert.Equal(t, sumOps(tr), prev) // everything fits at the top
	}
}

// MakePlan's result is never slower than any plan for a point of its grid
// (PlanGrid), each replayed on hw within the memory it was made for: the
// cells it did not plan are ruled out by the bound, which no plan beats.
func TestNeverSlowerThanAnyPlanOfTheGrid(t *testing.T) {
	r := rand.New(rand.NewSource(8))
	for i := 0; i < 12; i++ {
		tr, hw, _ := randomProblem(r)
		got, err := SimulatePolicy(tr, hw, PolicyG10)
		require.NoError(t, err)
		devs, hosts, links := PlanGrid(tr, hw)
		require.NotEmpty(t, devs)
		require.NotEmpty(t, links)
		require.Equal(t, int64(0), hosts[len(hosts)-1])
		in := newPlanInput(tr)
		for _, d := range devs {
			assert.LessOrEqual(t, d, hw.DeviceBytes)
			for _, h := range hosts {
				assert.LessOrEqual(t, h, hw.HostBytes)
				for _, l := range links {
					g := hw
					g.DeviceBytes, g.HostBytes = d, h
					g.SSDReadBps, g.SSDWriteBps, g.HostLinkBps = l.SSDReadBps, l.SSDWriteBps, l.HostLinkBps
					for _, v := range planVariants {
						p, err := in.plan(g, v)
						require.NoError(t, err)
						p.HostCapacity = &h
						on := Simulate(tr, hw, &p)
						assert.LessOrEqual(t, got.TimeNs, on.TimeNs, "trace %d: slower than the plan for %+v", i, g)
					}
				}
			}
		}
	}
}

// Random pairs of hardware, one with more device memory, more host memory,
// faster links, a faster SSD or a faster host link than the other: the
// plan for more is never slower (zero tolerance; it was in 5 of 3,000
// pairs while the candidates were a ladder below each hardware).
func TestMoreResourcesNeverSlower(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	for i := 0; i < 300; i++ {
		tr, hw, hi := randomProblem(r)
		h := more(r, hw, r.Intn(5), hi)
		base, err := SimulatePolicy(tr, hw, PolicyG10)
		require.NoError(t, err)
		got, err := SimulatePolicy(tr, h, PolicyG10)
		require.NoError(t, err)
		assert.LessOrEqual(t, got.TimeNs, base.TimeNs, "trace %d: slower on %+v than on %+v", i, h, hw)
	}
}

func TestSlowSSDSendsTrafficToHost(t *testing.T) {
	tr := layered(nil, 12, 64<<20, 1<<20)
	a := Analyze(tr)
	capB := (max64(a.OpBytes) + max64(a.Pressure)) / 2
	// Fast: a 64 MiB write takes 67 µs against ops of 1 to 2 ms, so the
	// SSD is never saturated (at Table 2's 3 GB/s it is: see
	// TestSaturatedSSDSharesWithHost).
	fast := smallHW(capB)
	fast.SSDReadBps, fast.SSDWriteBps = 1e12, 1e12
	slow := fast
	slow.SSDReadBps, slow.SSDWriteBps = 50e6, 50e6
	pf, err := MakePlan(tr, fast)
	require.NoError(t, err)
	ps, err := MakePlan(tr, slow)
	require.NoError(t, err)
	tiers := func(p MigrationPlan) map[string]int {
		m := map[string]int{}
		for _, x := range p.Migrations {
			m[x.Tier]++
		}
		return m
	}
	t.Logf("fast SSD tiers %v, slow SSD tiers %v", tiers(pf), tiers(ps))
	assert.Greater(t, tiers(ps)[TierHost], tiers(pf)[TierHost])
	rs, err := SimulatePolicy(tr, slow, PolicyG10)
	require.NoError(t, err)
	assert.Greater(t, rs.HostWriteBytes, int64(0))
}

// At Table 2's speeds a 64 MiB eviction keeps the SSD busy for 22 ms, over
// ten ops: the SSD's planned traffic saturates it, and the periods behind
// go to host memory, whose link is five times faster.
func TestSaturatedSSDSharesWithHost(t *testing.T) {
	tr := layered(nil, 12, 64<<20, 1<<20)
	a := Analyze(tr)
	hw := smallHW((max64(a.OpBytes) + max64(a.Pressure)) / 2)
	p, err := MakePlan(tr, hw)
	require.NoError(t, err)
	bytes := map[string]int64{}
	for _, m := range p.Migrations {
		bytes[m.Tier] += m.Bytes
	}
	with, err := SimulatePolicy(tr, hw, PolicyG10)
	require.NoError(t, err)
	bound := BoundNs(tr, hw)
	hw.HostBytes = 0
	without, err := SimulatePolicy(tr, hw, PolicyG10)
	require.NoError(t, err)
	t.Logf("planned bytes by tier %v; %d ns with host memory (bound %d), %d without, ideal %d",
		bytes, with.TimeNs, bound, without.TimeNs, with.IdealNs)
	assert.Greater(t, bytes[TierHost], bytes[TierSSD])
	assert.Less(t, float64(with.TimeNs), 0.8*float64(without.TimeNs))
	// Counting only writes against the SSD's saturation (and placing the
	// first periods on the SSD) took 2.09x the bound here; 1.36x now.
	assert.Less(t, float64(with.TimeNs), 1.5*float64(bound))
}

// A migration no window hides makes its op wait for the transfers; where
// host memory holds the tensor, the planner sends it over the faster link,
// here the host's (it had widened SSD periods to waiting ones and kept
// them on the SSD: ResNet at batch 256 and 400% ran at 0.244 of ideal, below
// on-demand's 0.334; 0.429 after). The planner itself with the SSD first
// (G10's order; the other variant sends every waiting migration to the
// host link), for the hardware given: MakePlan plans on its grid, whose
// links keep the artifact's proportions.
func TestWaitingMigrationsTakeTheFasterLink(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	waiting := 0
	for i := 0; i < 40; i++ {
		tr := layered(r, 2+r.Intn(12), 1<<20+r.Int63n(8<<20), 1<<16+r.Int63n(4<<20))
		for k := range tr.Ops { // fast ops: few windows hide a transfer
			tr.Ops[k].TimeNs = 1_000 + r.Int63n(20_000)
		}
		a := Analyze(tr)
		lo, hi := max64(a.OpBytes), max64(a.Pressure)
		hw := smallHW(lo + r.Int63n(hi-lo+1))
		slowHost := hw
		slowHost.HostLinkBps = hw.SSDWriteBps / 4 // then the SSD is the faster link
		for _, c := range []struct {
			hw   Hardware
			tier string
		}{{hw, TierHost}, {slowHost, TierSSD}} {
			in := newPlanInput(tr)
			for _, v := range []planVariant{{TierSSD, false}, {TierSSD, true}} {
				p, err := in.plan(c.hw, v)
				require.NoError(t, err)
				for _, m := range p.Migrations {
					if !m.Sync {
						continue
					}
					waiting++
					assert.Equal(t, c.tier, m.Tier, "trace %d, tensor %d, host link %g B/s, variant %+v", i, m.Tensor, c.hw.HostLinkBps, v)
				}
			}
		}
	}
	assert.Positive(t, waiting, "no trace made a migration wait")
}

func TestG10AgainstBaselines(t *testing.T) {
	r := rand.New(rand.NewSource(4))
	var sum = map[string]float64{}
	n := 0
	for i := 0; i < 30; i++ {
		tr := layered(r, 4+r.Intn(16), 8<<20+r.Int63n(64<<20), 1<<20+r.Int63n(8<<20))
		a := Analyze(tr)
		peak := max64(a.Pressure)
		capB := max(max64(a.OpBytes), peak*(25+r.Int63n(40))/100) // 150% to 400% demand
		hw := smallHW(capB)
		hw.HostBytes = 0 // SSD only: every policy migrates over the same link
		times := map[string]int64{}
		for _, pol := range []string{PolicyIdeal, PolicyOnDemand, PolicyFlashNeuron, PolicyG10} {
			res, err := SimulatePolicy(tr, hw, pol)
			require.NoError(t, err)
			require.True(t, res.Feasible, "%s: %s", pol, res.Error)
			times[pol] = res.TimeNs
			sum[pol] += float64(res.IdealNs) / float64(res.TimeNs)
		}
		n++
		t.Logf("trace %2d: demand %.0f%% of capacity; throughput vs ideal: on_demand %.3f flashneuron %.3f g10 %.3f",
			i, 100*float64(peak)/float64(capB), float64(times[PolicyIdeal])/float64(times[PolicyOnDemand]),
			float64(times[PolicyIdeal])/float64(times[PolicyFlashNeuron]), float64(times[PolicyIdeal])/float64(times[PolicyG10]))
		assert.LessOrEqual(t, times[PolicyG10], times[PolicyOnDemand], "trace %d: g10 slower than on_demand", i)
	}
	t.Logf("mean throughput vs ideal over %d traces: on_demand %.3f flashneuron %.3f g10 %.3f",
		n, sum[PolicyOnDemand]/float64(n), sum[PolicyFlashNeuron]/float64(n), sum[PolicyG10]/float64(n))
}

func TestReadTraceNamesThePathAndKind(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	require.NoError(t, os.WriteFile(good, []byte(seedTrace), 0o644))
	tr, err := ReadTrace(good)
	require.NoError(t, err)
	assert.Len(t, tr.Tensors, 4)

	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"version": 1, "tensors": [], "ops": [{"name": "a", "time_ns": -5}]}`), 0o644))
	_, err = ReadTrace(bad)
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrCorruptTrace)
	assert.ErrorIs(t, err, gds.ErrCorrupt)
	assert.ErrorIs(t, err, ErrTrace)
	assert.Contains(t, err.Error(), bad)
	assert.Contains(t, err.Error(), "negative time_ns")

	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	_, err = zw.Write([]byte(seedTrace))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	gz := filepath.Join(dir, "good.json.gz")
	require.NoError(t, os.WriteFile(gz, zb.Bytes(), 0o644))
	trz, err := ReadTrace(gz)
	require.NoError(t, err)
	assert.Equal(t, tr, trz)

	cut := filepath.Join(dir, "cut.json.gz")
	require.NoError(t, os.WriteFile(cut, zb.Bytes()[:zb.Len()/2], 0o644))
	_, err = ReadTrace(cut)
	assert.ErrorIs(t, err, ErrCorruptTrace)
	assert.ErrorIs(t, err, ErrTrace)
	assert.Contains(t, err.Error(), cut)
	assert.Contains(t, err.Error(), "gzip")

	_, err = ReadTrace(filepath.Join(dir, "missing.json"))
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.NotErrorIs(t, err, ErrCorruptTrace)
}

func TestErrorsAreKindsOfInvalid(t *testing.T) {
	tr, err := ParseTrace([]byte(seedTrace))
	require.NoError(t, err)
	_, err = SimulatePolicy(tr, G10Default(), "lru")
	assert.ErrorIs(t, err, gds.ErrInvalid)
	assert.Contains(t, err.Error(), `"lru"`)
	hw := G10Default()
	hw.SSDReadBps = 0
	_, err = SimulatePolicy(tr, hw, PolicyG10)
	assert.ErrorIs(t, err, ErrHardware)
	assert.ErrorIs(t, err, gds.ErrInvalid)
	hw = G10Default()
	hw.DeviceBytes = 1000
	_, err = MakePlan(tr, hw)
	assert.ErrorIs(t, err, ErrInfeasible)
	assert.ErrorIs(t, err, gds.ErrInvalid)
	_, err = ParseTrace([]byte(`{"version": 3}`))
	assert.ErrorIs(t, err, gds.ErrInvalid)
	assert.NotErrorIs(t, err, gds.ErrCorrupt)
}

// A trace with nothing live (no ops, ops without tensors, or only a weight
// no op uses) gets a plan at once: the grid of device sizes stops at 0
// instead of looking for a size below the largest op's 0 bytes forever.
func TestNothingLiveIsPlannedAtOnce(t *testing.T) {
	for name, tr := range map[string]*Trace{
		"empty":      {Version: TraceVersion, Tensors: []TraceTensor{}, Ops: []TraceOp{}},
		"no tensors": {Version: TraceVersion, Tensors: []TraceTensor{}, Ops: []TraceOp{{Name: "a", TimeNs: 5}}},
		"an unused weight": {Version: TraceVersion, Tensors: []TraceTensor{{ID: 0, Bytes: 1 << 20, Kind: KindWeight}},
			Ops: []TraceOp{{Name: "a", TimeNs: 5}}},
	} {
		done := make(chan error, 1)
		go func() { _, err := MakePlan(tr, G10Default()); done <- err }()
		select {
		case err := <-done:
			require.NoError(t, err, name)
		case <-time.After(time.Minute):
			t.Fatalf("%s: MakePlan did not return", name)
		}
		r, err := SimulatePolicy(tr, G10Default(), "g10")
		require.NoError(t, err, name)
		assert.Equal(t, tr.Ops != nil && len(tr.Ops) > 0, r.TimeNs == 5, name)
	}
}

// Links so slow that a transfer would take longer than int64 nanoseconds
// hold saturate the simulated times (146 years): never negative, never a
// wrapped stall or a bound below the ideal.
func TestAbsurdlySlowLinksSaturateTimes(t *testing.T) {
	act := func(id int) TraceTensor { return TraceTensor{ID: id, Bytes: 1 << 40, Kind: KindActivation} }
	tr := &Trace{Version: TraceVersion, Tensors: []TraceTensor{act(0), act(1)},
		Ops: []TraceOp{{Name: "a", TimeNs: 1000, Writes: []int{0}}, {Name: "b", TimeNs: 1000, Writes: []int{1}},
			{Name: "ra", TimeNs: 1000, Reads: []int{0}}, {Name: "rb", TimeNs: 1000, Reads: []int{1}}}}
	hw := G10Default()
	hw.DeviceBytes, hw.HostBytes = 1<<40+1<<20, 0 // one of the two at a time: each must go out and back
	hw.SSDReadBps, hw.SSDWriteBps, hw.HostLinkBps = 1e-6, 1e-6, 1e-6
	for _, policy := range []string{"on_demand", "flashneuron", "g10"} {
		r, err := SimulatePolicy(tr, hw, policy)
		require.NoError(t, err, policy)
		assert.True(t, r.Feasible, policy)
		assert.Equal(t, int64(maxNs), r.TimeNs, "%s: a transfer takes 10^24 s", policy)
		assert.GreaterOrEqual(t, r.TimeNs, r.IdealNs, policy)
		assert.GreaterOrEqual(t, r.StallNs, int64(0), policy)
		for k, s := range r.OpStallNs {
			assert.GreaterOrEqual(t, s, int64(0), "%s op %d", policy, k)
		}
	}
	assert.GreaterOrEqual(t, BoundNs(tr, hw), int64(4000))
}
