package hooks

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/internal/testutil"
)

// forEachTier runs test as a subtest per tier (and per spill engine), on a
// store opened for it. A spill engine that hands the file to another one
// here (direct on a filesystem without O_DIRECT) skips its subtest with
// the reason: the engine named would not be tested.
func forEachTier(t *testing.T, test func(t *testing.T, s *Store)) {
	t.Helper()
	for _, tier := range []struct {
		name string
		cfg  Config
	}{
		{"host", Config{Tier: "host"}},
		{"posix", Config{Tier: "ssd", Dir: t.TempDir(), Engine: "posix"}},
		{"direct", Config{Tier: "ssd", Dir: t.TempDir(), Engine: "direct"}},
		{"probed", Config{Tier: "ssd", Dir: t.TempDir()}},
	} {
		t.Run(tier.name, func(t *testing.T) {
			s, err := Open(tier.cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			skipIfFallback(t, s)
			test(t, s)
		})
	}
}

// skipIfFallback skips the test, with the reason, when the store's spill
// engine hands its file to another engine here.
func skipIfFallback(t *testing.T, s *Store) {
	t.Helper()
	if d := s.Describe(); d.Fallback != "" {
		t.Skipf("spill engine %v falls back in %s: %s", d.Engines, d.Dir, d.Fallback)
	}
}

func TestRoundTrip(t *testing.T) {
	forEachTier(t, func(t *testing.T, s *Store) {
		for i, n := range []int{0, 1, 4095, 4096, 4097, 1<<20 + 3} {
			want := testutil.Pattern(n, uint64(i))
			id, err := s.Put(want)
			require.NoError(t, err)
			require.NoError(t, s.Wait(id))
			for range 2 { // a slot stays readable after Get
				got := make([]byte, n)
				require.NoError(t, s.Get(id, got))
				require.True(t, bytes.Equal(want, got), "size %d", n)
			}
			require.NoError(t, s.Free(id))
			assert.ErrorIs(t, s.Get(id, make([]byte, n)), ErrUnknownSlot)
			assert.ErrorIs(t, s.Free(id), gds.ErrInvalid)
		}
		st := s.Stats()
		assert.Zero(t, st.LiveSlots)
		assert.Zero(t, st.StoredBytes)
		assert.EqualValues(t, 6, st.Puts)
	})
}

func TestConcurrentPutsAndGets(t *testing.T) {
	forEachTier(t, func(t *testing.T, s *Store) {
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(g), 7))
				var ids []SlotID
				var data [][]byte
				for i := range 20 {
					p := testutil.Pattern(1+r.IntN(200<<10), uint64(g*100+i))
					id, err := s.Put(p)
					if !assert.NoError(t, err) {
						return
					}
					ids, data = append(ids, id), append(data, p)
					if i%3 == 0 {
						assert.NoError(t, s.Prefetch(id, nil))
					}
				}
				for i, id := range ids {
					got := make([]byte, len(data[i]))
					assert.NoError(t, s.Get(id, got))
					assert.True(t, bytes.Equal(data[i], got))
					assert.NoError(t, s.Free(id))
				}
			}()
		}
		wg.Wait()
		assert.Zero(t, s.Stats().LiveSlots)
	})
}

func TestFreeListReuse(t *testing.T) {
	s, err := Open(Config{Dir: t.TempDir(), Engine: "posix"})
	require.NoError(t, err)
	defer s.Close()
	a, _ := s.Put(testutil.Pattern(8192, 1))
	b, _ := s.Put(testutil.Pattern(4096, 2))
	require.NoError(t, s.Wait(a))
	offA := s.slots[a].ext.off
	require.NoError(t, s.Free(a))
	c, _ := s.Put(testutil.Pattern(5000, 3))
	require.NoError(t, s.Wait(c))
	assert.Equal(t, offA, s.slots[c].ext.off, "a freed slot's extent is reused")
	got := make([]byte, 4096)
	require.NoError(t, s.Get(b, got))
	assert.Equal(t, testutil.Pattern(4096, 2), got, "reuse does not disturb neighbours")
	assert.EqualValues(t, 12288, s.Stats().PeakStoredBytes)
}

func TestPrefetchIntoCallerBuffer(t *testing.T) {
	forEachTier(t, func(t *testing.T, s *Store) {
		want := testutil.Pattern(300<<10, 5)
		id, err := s.Put(want)
		require.NoError(t, err)
		dst := make([]byte, len(want))
		require.NoError(t, s.Prefetch(id, dst)) // may start before the write ends
		require.NoError(t, s.Prefetch(id, dst), "a second prefetch is a no-op")
		require.NoError(t, s.Get(id, dst))
		assert.Equal(t, want, dst)
		st := s.Stats()
		assert.EqualValues(t, 1, st.PrefetchHits)
		assert.EqualValues(t, 1, st.Prefetches)
		assert.Zero(t, st.PrefetchBytes)
		assert.EqualValues(t, len(want), st.PeakPrefetchBytes)
		assert.ErrorIs(t, s.Prefetch(id, make([]byte, 3)), gds.ErrInvalid)
		// Freed with a prefetch still pending: Free waits for it.
		require.NoError(t, s.Prefetch(id, nil))
		require.NoError(t, s.Free(id))
	})
}

func TestPollAndCompleted(t *testing.T) {
	s, err := Open(Config{Tier: "host"})
	require.NoError(t, err)
	defer s.Close()
	id, err := s.Put(testutil.Pattern(10, 1))
	require.NoError(t, err)
	require.NoError(t, s.Wait(id))
	done, err := s.Poll(id)
	assert.True(t, done)
	assert.NoError(t, err)
	assert.Equal(t, []SlotID{id}, s.Completed(10))
	assert.Empty(t, s.Completed(10))
	info, err := s.Info(id)
	require.NoError(t, err)
	assert.True(t, info.Written)
	assert.Equal(t, "memory", info.WriteEngine)
}

func TestCloseFreesEverything(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir})
	require.NoError(t, err)
	for i := range 10 {
		_, err := s.Put(testutil.Pattern(64<<10, uint64(i))) // never waited for nor freed
		require.NoError(t, err)
	}
	require.NoError(t, s.Close())
	assert.ErrorIs(t, s.Close(), ErrClosed)
	_, err = s.Put([]byte{1})
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, s.Wait(1), ErrClosed)
	assert.Empty(t, spillFDs(t, dir))
}

// spillFDs lists this process's descriptors open on files in dir.
func spillFDs(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.HasPrefix(target, dir+"/") {
			out = append(out, target)
		}
	}
	return out
}

func TestSpillFileIsInvisibleAndClosed(t *testing.T) {
	for _, how := range []string{"O_TMPFILE", "unlink-after-open"} {
		t.Run(how, func(t *testing.T) {
			noTmpfile = how != "O_TMPFILE"
			defer func() { noTmpfile = false }()
			dir := t.TempDir()
			s, err := Open(Config{Dir: dir})
			require.NoError(t, err)
			assert.Equal(t, how, s.Describe().Spill)
			id, err := s.Put(testutil.Pattern(1<<20, 1))
			require.NoError(t, err)
			require.NoError(t, s.Wait(id))

			ents, err := os.ReadDir(dir)
			require.NoError(t, err)
			assert.Empty(t, ents, "the spill file has no name in the directory")
			fds := spillFDs(t, dir)
			require.NotEmpty(t, fds)
			for _, target := range fds {
				assert.Contains(t, target, "(deleted)")
			}
			assert.Greater(t, s.Stats().FileBytes, int64(1<<20))

			require.NoError(t, s.Close())
			assert.Empty(t, spillFDs(t, dir), "every descriptor is closed")
		})
	}
}

func TestBadSpillDirectory(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	_, err := Open(Config{Dir: missing})
	require.ErrorIs(t, err, ErrSpillDir)
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.Contains(t, err.Error(), missing)

	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	_, err = Open(Config{Dir: file})
	require.ErrorIs(t, err, ErrSpillDir)
	assert.Contains(t, err.Error(), "not a directory")

	_, err = Open(Config{Tier: "disk"})
	assert.ErrorIs(t, err, gds.ErrInvalid)
}

func TestUnalignedMemoryBetweenOneAndTwoTaskSizes(t *testing.T) {
	s, err := Open(Config{Dir: t.TempDir(), Engine: "direct", Options: gds.Options{TaskSize: 64 << 10}})
	require.NoError(t, err)
	defer s.Close()
	skipIfFallback(t, s)
	want := testutil.Pattern(100<<10+1, 9)[1:] // 100 KiB at an unaligned address
	id, err := s.Put(want)
	require.NoError(t, err)
	require.NoError(t, s.Wait(id))
	got := make([]byte, len(want)+1)[1:]
	require.NoError(t, s.Get(id, got))
	assert.Equal(t, want, got)
}

func TestTransferPanicBecomesError(t *testing.T) {
	_, err := guard(func() (string, error) { panic("boom") })
	assert.ErrorIs(t, err, ErrInternal)
	assert.Contains(t, err.Error(), "boom")
}

func TestStallCountsTheTimeGetWaits(t *testing.T) {
	forEachTier(t, func(t *testing.T, s *Store) {
		want := testutil.Pattern(1<<20, 9)
		id, err := s.Put(want)
		require.NoError(t, err)
		require.NoError(t, s.Wait(id))
		dst := make([]byte, len(want))
		require.NoError(t, s.Get(id, dst)) // no prefetch: a synchronous read
		assert.Equal(t, want, dst)
		info, err := s.Info(id)
		require.NoError(t, err)
		st := s.Stats()
		assert.Positive(t, info.ReadNs)
		assert.GreaterOrEqual(t, st.StallNs, info.ReadNs, "the synchronous read is stall time")
		assert.Zero(t, st.PrefetchHits)
	})
}

// Two users of one store each see their own slots' transfers in their
// account; the store's totals hold both, and slots put in no account count
// only there.
func TestAccountsCountTheirOwnSlots(t *testing.T) {
	forEachTier(t, func(t *testing.T, s *Store) {
		a, err := s.NewAccount()
		require.NoError(t, err)
		b, err := s.NewAccount()
		require.NoError(t, err)
		put := func(acct Account, n int, seed uint64) SlotID {
			id, err := s.PutIn(acct, testutil.Pattern(n, seed))
			require.NoError(t, err)
			require.NoError(t, s.Wait(id))
			return id
		}
		ida := put(a, 3<<20, 1)
		idb1, idb2 := put(b, 1<<20, 2), put(b, 5000, 3)
		idn := put(0, 7000, 4)
		require.NoError(t, s.Prefetch(idb1, nil))
		require.NoError(t, s.Get(idb1, make([]byte, 1<<20)))
		require.NoError(t, s.Get(ida, make([]byte, 3<<20)))
		for _, id := range []SlotID{ida, idb1, idb2, idn} {
			require.NoError(t, s.Free(id))
		}
		sa, err := s.StatsOf(a)
		require.NoError(t, err)
		sb, err := s.StatsOf(b)
		require.NoError(t, err)
		all := s.Stats()
		assert.EqualValues(t, 1, sa.Puts)
		assert.EqualValues(t, 3<<20, sa.BytesWritten)
		assert.EqualValues(t, 3<<20, sa.BytesRead)
		assert.EqualValues(t, 1, sa.Gets)
		assert.Zero(t, sa.Prefetches)
		assert.EqualValues(t, 2, sb.Puts)
		assert.EqualValues(t, 1<<20+5000, sb.BytesWritten)
		assert.EqualValues(t, 1<<20, sb.BytesRead)
		assert.EqualValues(t, 1, sb.Prefetches)
		assert.EqualValues(t, 1, sb.PrefetchHits)
		assert.Zero(t, sb.PrefetchBytes)
		var engA, engB, engAll int64
		for _, n := range sa.EngineBytes {
			engA += n
		}
		for _, n := range sb.EngineBytes {
			engB += n
		}
		for _, n := range all.EngineBytes {
			engAll += n
		}
		assert.Equal(t, sa.BytesWritten, engA)
		assert.Equal(t, sb.BytesWritten, engB)
		assert.EqualValues(t, 4, all.Puts)
		assert.Equal(t, sa.BytesWritten+sb.BytesWritten+7000, all.BytesWritten)
		assert.Equal(t, all.BytesWritten, engAll)
		assert.Equal(t, sa.Gets+sb.Gets, all.Gets)

		_, err = s.StatsOf(3)
		assert.ErrorIs(t, err, gds.ErrInvalid)
		_, err = s.PutIn(3, []byte{1})
		assert.ErrorIs(t, err, gds.ErrInvalid)
		assert.Contains(t, err.Error(), "account 3")
	})
}
