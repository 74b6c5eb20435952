package offload

import (
	"math/rand"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A written by op 0 and read by op 2, B written and dropped by op 1: with
// room for 1500 bytes, 500 of A's must leave during op 0 to 1 and come back
// during op 1 to 2, at 2 bytes/ns each way (SSD and host link together).
func TestBoundByHand(t *testing.T) {
	tr := &Trace{Version: 1,
		Tensors: []TraceTensor{{ID: 0, Bytes: 1000, Kind: KindActivation}, {ID: 1, Bytes: 1000, Kind: KindWorkspace}},
		Ops: []TraceOp{
			{Name: "a", TimeNs: 10, Writes: []int{0}},
			{Name: "b", TimeNs: 100, Writes: []int{1}},
			{Name: "c", TimeNs: 10, Reads: []int{0}},
		}}
	require.NoError(t, tr.Validate())
	hw := Hardware{DeviceBytes: 1500, HostBytes: 1 << 40, SSDReadBps: 1e9, SSDWriteBps: 1e9, HostLinkBps: 1e9}
	assert.Equal(t, int64(250+250+10), BoundNs(tr, hw))
	hw.HostBytes = 200 // host memory holds 200 of the 500: 300 cross the SSD's link each way
	assert.Equal(t, int64(300+300+10), BoundNs(tr, hw))
	assert.Equal(t, int64(250+250+10), boundNs(Analyze(tr), tr, hw, false), "the links' bound alone")
	hw.HostBytes = 0 // the SSD alone: 1 byte/ns
	assert.Equal(t, int64(500+500+10), BoundNs(tr, hw))
	hw.DeviceBytes = 2000 // room for both: nothing moves
	assert.Equal(t, int64(120), BoundNs(tr, hw))
	hw.DeviceBytes = 999 // op 0 alone does not fit
	assert.Zero(t, BoundNs(tr, hw))
}

func TestBoundBelowEveryPolicy(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	tight, hostTight := 0, 0
	for i := 0; i < 60; i++ {
		tr := layered(r, 2+r.Intn(12), 1<<20+r.Int63n(16<<20), 1<<16+r.Int63n(4<<20))
		a := Analyze(tr)
		lo, hi := max64(a.OpBytes), max64(a.Pressure)
		hw := smallHW(lo + r.Int63n(hi-lo+1))
		switch r.Intn(3) {
		case 0:
			hw.HostBytes = 0
		case 1:
			hw.HostBytes = r.Int63n(hi) // host memory may bind
		}
		b := BoundNs(tr, hw)
		if b > boundNs(a, tr, hw, false) {
			hostTight++
		}
		assert.GreaterOrEqual(t, b, sumOps(tr))
		if b > sumOps(tr) {
			tight++
		}
		for _, pol := range []string{PolicyOnDemand, PolicyFlashNeuron, PolicyG10} {
			res, err := SimulatePolicy(tr, hw, pol)
			require.NoError(t, err)
			require.True(t, res.Feasible, res.Error)
			assert.LessOrEqual(t, b, res.TimeNs, "trace %d, %s", i, pol)
		}
	}
	assert.Positive(t, tight, "no trace bound by the links: the check above tests nothing")
	assert.Positive(t, hostTight, "no trace bound by host memory: the check above tests nothing")
	tr := layered(nil, 6, 1<<20, 1<<18)
	assert.Equal(t, sumOps(tr), BoundNs(tr, smallHW(max64(Analyze(tr).Pressure))))
}
