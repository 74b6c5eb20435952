package frontend

import (
	"encoding/json"
	"io/fs"
	"math"
	"path/filepath"
	"runtime/debug"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/loader"
	"github.com/pyfastensor/pyfastensor/loader/dist"
)

func distOptions(rank, world int) dist.Options {
	return dist.Options{Rank: rank, World: world, Token: "job-secret", RemoteBytes: 1 << 16}
}

// A local loader's batches cross in two calls: Get delivers and keeps the
// samples under a ticket, Take copies them out once; a ticket taken,
// given back or of the wrong length is refused with what is wrong.
func TestLocalGetTake(t *testing.T) {
	tp := newTestPack(t, 64, 8, 300)
	l, s, err := Open(tp.dir, loader.ServerOptions{Budget: tp.budget(t, 1), Seed: 5, Overflow: loader.DefaultOverflow})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	require.Equal(t, 64, s.Samples)
	require.Equal(t, 8, s.Chunks)
	require.NotNil(t, s.Layout, "a server's summary has its layout")
	require.Nil(t, s.Layout.Owned)
	require.Equal(t, 64, l.Len())

	got := take(t, l, []int{0, 1, 2, 3})
	require.Len(t, got, 4)
	tp.requireSource(t, got)

	ticket, batch, err := l.Get([]int{4, 5})
	require.NoError(t, err)
	err = l.Take(ticket, 3, func(int, int) ([]byte, error) { return nil, nil })
	require.ErrorIs(t, err, gds.ErrInvalid)
	require.ErrorContains(t, err, "3 addresses for the 2 samples")
	err = l.Take(ticket, len(batch), func(int, int) ([]byte, error) { return nil, nil })
	require.ErrorIs(t, err, gds.ErrInvalid)
	require.ErrorContains(t, err, "no batch of ticket", "a refused take drops the ticket")
	require.ErrorIs(t, l.GiveBack(ticket), gds.ErrInvalid)

	// A batch given back is served again: its requests get its samples.
	ticket, batch, err = l.Get([]int{6, 7})
	require.NoError(t, err)
	require.NoError(t, l.GiveBack(ticket))
	again := take(t, l, []int{6, 7})
	for k := range again {
		require.Equal(t, batch[k].Position, again[k].Position)
	}
	tp.requireSource(t, again)

	// A copy that cannot have its memory names the sample and ticket.
	ticket, _, err = l.Get([]int{8})
	require.NoError(t, err)
	err = l.Take(ticket, 1, func(int, int) ([]byte, error) { return nil, gds.ErrInvalid })
	require.ErrorIs(t, err, gds.ErrInvalid)
	require.ErrorContains(t, err, "sample 0 of ticket")
}

// The dist calls need a node: on a loader that is not one they fail,
// naming the call and what is missing, and change nothing.
func TestDistCallsWithoutNode(t *testing.T) {
	tp := newTestPack(t, 32, 8, 100)
	l := tp.open(t, 0, 1)
	for name, call := range map[string]func() error{
		"dist connect":  func() error { return l.DistConnect([]string{"127.0.0.1:1"}) },
		"dist sequence": func() error { return l.DistSequence(0, []int{0, 1}) },
		"dist drop":     l.DistDrop,
	} {
		err := call()
		require.ErrorIs(t, err, gds.ErrInvalid, name)
		require.ErrorContains(t, err, name+": the server is not a node of a cluster", name)
	}
	require.Nil(t, l.Stats().Dist, "a server's stats have no node's")
	tp.requireSource(t, take(t, l, []int{0, 1}))
}

// A local loader's epoch, state, restore and stats are its server's: the
// state is a loader.State (no rank), a second loader restored from it
// serves the rest of the epoch, and a node's state does not parse as one.
func TestLocalStateRestore(t *testing.T) {
	tp := newTestPack(t, 48, 8, 200)
	a := tp.open(t, 0, 1)
	require.NoError(t, a.SetEpoch(2))
	require.EqualValues(t, 2, a.Epoch())
	first := take(t, a, []int{0, 1, 2, 3, 4, 5})
	require.EqualValues(t, 6, a.Stats().Served)

	st, err := a.State()
	require.NoError(t, err)
	var fields map[string]any
	require.NoError(t, json.Unmarshal(st, &fields))
	require.Contains(t, fields, "pack")
	require.NotContains(t, fields, "rank", "a server's state, not a node's")
	var ls loader.State
	require.NoError(t, json.Unmarshal(st, &ls))
	require.EqualValues(t, 2, ls.Epoch)
	require.Equal(t, 6, ls.Served)

	b := tp.open(t, 0, 1)
	require.NoError(t, b.Restore(st))
	require.EqualValues(t, 2, b.Epoch())
	rest := make([]int, 0, 42)
	for i := 6; i < 48; i++ {
		rest = append(rest, i)
	}
	second := take(t, b, rest)
	tp.requireSource(t, second)
	seen := map[int]bool{}
	for _, s := range slices.Concat(first, second) {
		require.False(t, seen[s.Position], "position %d twice", s.Position)
		seen[s.Position] = true
	}
	require.Len(t, seen, 48, "the restored loader serves the rest of the epoch")

	err = b.Restore([]byte("{not json"))
	require.ErrorIs(t, err, gds.ErrInvalid)
	require.ErrorContains(t, err, "a server's state")
}

// A loader's workers' calls (TurnBackend, Resumable) are its server's
// until it joins a cluster.
func TestLocalWorkerCalls(t *testing.T) {
	tp := newTestPack(t, 32, 8, 100)
	l := tp.open(t, 0, 1)
	// The server's own check answers (a node of a cluster refuses any parts).
	err := l.RestoreParts(nil)
	require.ErrorIs(t, err, loader.ErrState, "the server checks the parts")
	assert.Contains(t, err.Error(), "no DataLoader worker's part")
	res, err := l.GetBatchInTurn(loader.Turn{Worker: 0, Workers: 1}, []int{0, 1}, false, time.Second, nil)
	require.NoError(t, err)
	require.Len(t, res.Samples, 2)
	l.Release(res.Samples)
	_, err = l.GetBatchInTurn(loader.Turn{}, []int{2}, false, time.Second, nil)
	require.ErrorIs(t, err, gds.ErrInvalid, "the server checks the turn")
	assert.Contains(t, err.Error(), "worker 0 of 0")
}

// Listen serves one address; Close closes once and gives the budget back
// to the memory limit.
func TestListenClose(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	tp := newTestPack(t, 32, 8, 100)
	l, _, err := Open(tp.dir, loader.ServerOptions{Budget: tp.budget(t, 1), Overflow: loader.DefaultOverflow})
	require.NoError(t, err)
	if before == math.MaxInt64 {
		require.Less(t, debug.SetMemoryLimit(-1), before, "an open loader's budget sets the limit")
	}
	addr := filepath.Join(t.TempDir(), "loader.sock")
	require.NoError(t, l.Listen(addr, loader.LocalOptions{}))
	err = l.Listen(addr+"2", loader.LocalOptions{})
	require.ErrorIs(t, err, gds.ErrInvalid)
	require.ErrorContains(t, err, "listens on "+addr+" already")

	require.NoError(t, l.Close())
	require.Equal(t, before, debug.SetMemoryLimit(-1), "the budget given back")
	require.ErrorIs(t, l.Close(), loader.ErrClosed)
	require.Equal(t, before, debug.SetMemoryLimit(-1), "given back once")
}

// A node of a cluster: the epoch, the requests, the state, restore and
// stats are the node's; it joins one cluster, and its workers do not
// resume from parts.
func TestClusterNode(t *testing.T) {
	tp := newTestPack(t, 96, 8, 200)
	ls := tp.cluster(t, 2)

	_, err := ls[0].DistListen("127.0.0.1:0", distOptions(0, 2))
	require.ErrorIs(t, err, gds.ErrInvalid)
	require.ErrorContains(t, err, "a node of a cluster already")

	for _, l := range ls {
		require.NoError(t, l.SetEpoch(1))
		require.EqualValues(t, 1, l.Epoch())
	}
	shares := [][]int{{}, {}}
	for i := range 96 {
		shares[i%2] = append(shares[i%2], i)
	}
	for r, l := range ls {
		require.NoError(t, l.DistSequence(1, shares[r]))
	}
	for r, l := range ls {
		got := take(t, l, shares[r][:4])
		tp.requireSource(t, got)
		// A worker's batch on a node comes from the node, as it comes: no
		// turn is checked (a server refuses Turn{}).
		res, err := l.GetBatchInTurn(loader.Turn{}, shares[r][4:6], true, time.Second, nil)
		require.NoError(t, err)
		require.Len(t, res.Samples, 2)
		l.Release(res.Samples)

		st := l.Stats()
		require.NotNil(t, st.Dist, "a node's stats")
		require.Equal(t, r, st.Dist.Rank)
		require.EqualValues(t, 6, st.Dist.LocalRequests+st.Dist.RemoteHits+st.Dist.RemoteMisses)

		err = l.RestoreParts(nil)
		require.ErrorIs(t, err, gds.ErrUnsupported)
		require.ErrorContains(t, err, "not from DataLoader workers' parts")
	}

	for _, l := range ls {
		require.NoError(t, l.DistDrop())
	}
	states := make([]json.RawMessage, 2)
	for r, l := range ls {
		states[r], err = l.State()
		require.NoError(t, err)
		var st dist.State
		require.NoError(t, json.Unmarshal(states[r], &st))
		require.Equal(t, r, st.Rank, "a node's state")
		require.Equal(t, 2, st.World)
		require.Equal(t, 6, st.Issued)
		require.EqualValues(t, 1, st.Epoch)
	}

	// A fresh cluster restores each node from its rank's state; a node
	// refuses another rank's, and a server's.
	again := tp.cluster(t, 2)
	err = again[0].Restore(states[1])
	require.ErrorIs(t, err, loader.ErrState)
	assert.Contains(t, err.Error(), "a state of rank 1 of 2 for rank 0 of 2")
	local, err := tp.open(t, 0, 1).State()
	require.NoError(t, err)
	require.ErrorIs(t, again[0].Restore(local), loader.ErrState, "a server's state has no rank and world")
	require.ErrorContains(t, again[0].Restore([]byte("[")), "a node's state")
	for r, l := range again {
		require.NoError(t, l.Restore(states[r]))
		require.EqualValues(t, 1, l.Epoch())
		require.NotNil(t, l.Stats().Dist)
	}
}

// Open fails on a directory with no pack, with the kind the C ABI maps
// (not found), and holds no budget.
func TestOpenMissing(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	_, _, err := Open(filepath.Join(t.TempDir(), "missing"), loader.ServerOptions{Budget: 1 << 20})
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.Equal(t, before, debug.SetMemoryLimit(-1))
}
