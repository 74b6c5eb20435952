package loader

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// A state taken after cut requests and restored into a new server over a
// freshly opened pack: the remaining requests deliver exactly the samples
// not yet delivered, once each, and the very ones the first server would
// have delivered.
func TestStateResume(t *testing.T) {
	const n = 150
	ds, p := newPack(t, datasetOpts{n: n, classes: 3, maxSize: 400, seed: 51}, 7)
	reqs := perm(n, 4)
	for k, budget := range []int64{minBudget(p), (minBudget(p) + maxBudget(p)) / 3, maxBudget(p), 2 * maxBudget(p)} {
		over := []float64{0, 0, 0, DefaultOverflow}[k] // and overflow: spares in the state
		newServer := func(t testing.TB, p *Packed, budget int64, seed uint64) *Server {
			s, err := NewServer(p, ServerOptions{Budget: budget, Seed: seed, Overflow: over})
			require.NoError(t, err)
			return s
		}
		ref := newServer(t, p, budget, 8)
		require.NoError(t, ref.SetEpoch(3))
		want := serveAll(t, ref, ds, reqs, 4)

		for _, cut := range []int{0, 1, n / 2, n - 1, n} {
			a := newServer(t, p, budget, 8)
			require.NoError(t, a.SetEpoch(3))
			before := serveAll(t, a, ds, reqs[:cut], 5)
			st, err := a.State()
			require.NoError(t, err)
			blob, err := json.Marshal(st)
			require.NoError(t, err)

			var st2 State
			require.NoError(t, json.Unmarshal(blob, &st2))
			p2, err := OpenPack(p.Dir)
			require.NoError(t, err)
			b := newServer(t, p2, budget, 999) // the state's seed wins
			require.NoError(t, b.Restore(st2))
			require.Equal(t, uint64(3), b.Epoch())
			after := serveAll(t, b, ds, reqs[cut:], 3)
			all := append(before, after...)
			requireExactlyOnce(t, n, all)
			require.Equal(t, positions(want), positions(all), "budget %d, resumed after %d", budget, cut)

			_, err = b.Get(reqs[0])
			require.ErrorIs(t, err, ErrEpochDone, "the epoch is over: an error until SetEpoch")
			require.NoError(t, b.SetEpoch(4))
			_, err = b.Get(reqs[0])
			require.NoError(t, err)
		}
	}
}

// At the epoch boundary the state says so: a restored server refuses
// requests until SetEpoch, then serves the next epoch as a fresh server
// would.
func TestStateAtTheBoundary(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 30, classes: 2, maxSize: 100, seed: 52}, 4)
	budget := (minBudget(p) + maxBudget(p)) / 2
	a := newServer(t, p, budget, 1)
	serveAll(t, a, ds, perm(30, 1), 30)
	st, err := a.State()
	require.NoError(t, err)
	require.Equal(t, 30, st.Served)

	b := newServer(t, p, budget, 1)
	require.NoError(t, b.Restore(st))
	_, err = b.GetBatch([]int{5})
	require.ErrorIs(t, err, ErrEpochDone)
	require.NoError(t, b.SetEpoch(1))
	fresh := newServer(t, p, budget, 1)
	require.NoError(t, fresh.SetEpoch(1))
	reqs := perm(30, 2)
	require.Equal(t, positions(serveAll(t, fresh, ds, reqs, 4)), positions(serveAll(t, b, ds, reqs, 4)))
}

func TestStateRefusals(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 37, classes: 2, maxSize: 200, seed: 53}, 5)
	budget := (minBudget(p) + maxBudget(p)) / 2
	a := newServer(t, p, budget, 1)
	serveAll(t, a, ds, perm(37, 1)[:13], 13)
	st, err := a.State()
	require.NoError(t, err)

	_, other := newPack(t, datasetOpts{n: 40, classes: 2, maxSize: 200, seed: 54}, 5)
	for _, tc := range []struct {
		name, want string
		server     *Server
		change     func(st *State)
	}{
		{"another pack", "the state is of pack", newServer(t, other, maxBudget(other), 1), func(*State) {}},
		{"another layout", "this server's budget of", newServer(t, p, maxBudget(p), 1), func(*State) {}},
		{"a newer version", "state version 2", nil, func(st *State) { st.Version = 2 }},
		{"a short bitmap", "bitmaps of 4 and 5 bytes for 37 samples", nil, func(st *State) { st.Filled = st.Filled[:4] }},
		{"a bit past the end", "bitmaps of 5 and 5 bytes for 37 samples", nil, func(st *State) {
			st.Filled = append([]byte(nil), st.Filled...)
			st.Filled[4] |= 0x80 // position 39
		}},
		{"delivered, never filled", "delivered but never filled", nil, func(st *State) {
			st.Filled = make([]byte, len(st.Filled))
		}},
		{"two samples in one slot", "both in slot", nil, func(st *State) {
			st.Filled = []byte{0xff, 0xff, 0xff, 0xff, 0x1f}
		}},
		{"a spare never filled", "spare position 36 is not filled", nil, func(st *State) { st.Spares = []int{36} }},
		{"a spare twice", "listed twice", nil, func(st *State) {
			st.Filled = []byte{0xff, 0xff, 0xff, 0xff, 0x1f}
			st.Spares = []int{36, 36}
		}},
		{"a count that disagrees", "14 samples served, 13 delivered", nil, func(st *State) { st.Served++ }},
		{"a stream position past any", "tie-break stream position", nil, func(st *State) { st.Draws = 1 << 40 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.server
			if s == nil {
				s = newServer(t, p, budget, 1)
			}
			bad := st
			tc.change(&bad)
			err := s.Restore(bad)
			require.ErrorIs(t, err, ErrState)
			require.ErrorContains(t, err, tc.want)
		})
	}
}
