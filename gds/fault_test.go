package gds

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Tests of the fault injectors and the faulty engine. That the faulty
// engine fits the engine contract is contract_test.go's (faultyPosix).

// faultyFile opens a new file in a temporary directory through posix
// wrapped with inj.
func faultyFile(t *testing.T, inj Injector) (File, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "f")
	f, err := Faulty(NewPosix(Options{}), inj).Open(path, os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return f, path
}

func TestOnNthFailsOnlyTheNthMatchingCall(t *testing.T) {
	inj := OnNth(3, OpWrite)
	f, path := faultyFile(t, inj)
	for i := range 5 {
		_, err := f.ReadAt(make([]byte, 1), 100) // reads are not counted
		require.ErrorIs(t, err, ErrEOF)
		require.NotErrorIs(t, err, ErrInjected)
		n, err := f.WriteAt([]byte{byte(i)}, int64(i))
		if i != 2 {
			require.NoError(t, err, "write %d", i+1)
			continue
		}
		require.ErrorIs(t, err, ErrInjected, "the third write fails")
		assert.Zero(t, n)
		var op *OpError
		require.ErrorAs(t, err, &op)
		assert.Equal(t, "posix", op.Engine, "errors name the engine that serves the file")
		assert.Equal(t, "write", op.Op)
		assert.Equal(t, path, op.Path)
		assert.EqualValues(t, 2, op.Offset)
		assert.Equal(t, fmt.Sprintf("posix: write %s at 2: injected fault", path), err.Error())
	}
	assert.Equal(t, 1, inj.Fired())
	assert.Equal(t, "posix", f.Engine())
	assert.Empty(t, f.Fallback())
}

func TestOnNthOfAnyKind(t *testing.T) {
	inj := OnNth(3) // the open is the first operation
	f, _ := faultyFile(t, inj)
	require.NoError(t, f.Sync())
	_, err := f.Size()
	require.ErrorIs(t, err, ErrInjected)
	assert.Contains(t, err.Error(), "posix: stat ")
	require.NoError(t, f.Truncate(10))
}

// draws returns which of n operations inj fails.
func draws(inj Injector, n int) []bool {
	out := make([]bool, n)
	for i := range out {
		out[i] = inj.MaybeError(FaultOp{Kind: OpRead, Offset: int64(i), Len: 1}) != nil
	}
	return out
}

func TestRandomIsReproducible(t *testing.T) {
	a, b := draws(Random(7, 0.3), 1000), draws(Random(7, 0.3), 1000)
	assert.Equal(t, a, b, "the same seed fails the same operations")
	assert.NotEqual(t, a, draws(Random(8, 0.3), 1000), "another seed fails others")
	fired := 0
	for _, x := range a {
		if x {
			fired++
		}
	}
	assert.InDelta(t, 300, fired, 60, "about p of the operations fail")
	assert.NotContains(t, draws(Random(7, 0), 100), true)
	assert.NotContains(t, draws(Random(7, 1), 100), false)

	// Kinds outside the filter draw nothing: they neither fail nor move
	// the sequence.
	r := Random(7, 0.3, OpRead)
	var mixed []bool
	for i := range 1000 {
		assert.NoError(t, r.MaybeError(FaultOp{Kind: OpWrite}))
		mixed = append(mixed, r.MaybeError(FaultOp{Kind: OpRead, Offset: int64(i), Len: 1}) != nil)
	}
	assert.Equal(t, a, mixed)
}

func TestRandomOverAFile(t *testing.T) {
	run := func() []bool {
		f, _ := faultyFile(t, Random(42, 0.5, OpWrite))
		var failed []bool
		for i := range 64 {
			_, err := f.WriteAt([]byte{1, 2, 3}, int64(3*i))
			failed = append(failed, err != nil)
			if err != nil {
				require.ErrorIs(t, err, ErrInjected)
			}
		}
		return failed
	}
	first := run()
	assert.Equal(t, first, run(), "a seed replays a run")
	assert.Contains(t, first, true)
	assert.Contains(t, first, false)
}

func TestAtOffset(t *testing.T) {
	inj := AtOffset(4096, 8192)
	for _, c := range []struct {
		op   FaultOp
		want bool
	}{
		{FaultOp{Kind: OpWrite, Offset: 0, Len: 4096}, false},
		{FaultOp{Kind: OpWrite, Offset: 0, Len: 4097}, true},
		{FaultOp{Kind: OpRead, Offset: 8191, Len: 1}, true},
		{FaultOp{Kind: OpRead, Offset: 8192, Len: 100}, false},
		{FaultOp{Kind: OpRead, Offset: 5000, Len: 0}, true},
		{FaultOp{Kind: OpRead, Offset: 0, Len: 1 << 20}, true},
		{FaultOp{Kind: OpTruncate, Offset: 5000}, true},
		{FaultOp{Kind: OpTruncate, Offset: 8192}, false},
		{FaultOp{Kind: OpSync}, false},
		{FaultOp{Kind: OpOpen}, false},
	} {
		assert.Equal(t, c.want, inj.MaybeError(c.op) != nil, "%+v", c.op)
	}

	// Combined: the second write that touches the range, and only it.
	nth := OnNth(2, OpWrite).AtOffset(4096, 8192)
	f, _ := faultyFile(t, nth)
	buf := make([]byte, 100)
	for _, off := range []int64{0, 4000, 9000, 5000, 6000} {
		_, err := f.WriteAt(buf, off)
		if off == 5000 {
			require.ErrorIs(t, err, ErrInjected)
			assert.Contains(t, err.Error(), "at 5000")
		} else {
			require.NoError(t, err, "write at %d", off)
		}
	}
	_, err := f.ReadAt(buf, 5000)
	require.NoError(t, err, "a write filter lets reads through")
}

func TestAnyConsultsEveryInjector(t *testing.T) {
	first, second := OnNth(1, OpSync), OnNth(2, OpSync).WithError(unix.EIO)
	f, _ := faultyFile(t, Any(first, second))
	err := f.Sync()
	require.ErrorIs(t, err, ErrInjected)
	require.NotErrorIs(t, err, unix.EIO)
	err = f.Sync()
	require.ErrorIs(t, err, unix.EIO, "the second injector counted the first sync too")
	require.NoError(t, f.Sync())
	assert.Equal(t, 1, first.Fired())
	assert.Equal(t, 1, second.Fired())
}

func TestInjectedNoSpaceIsClassified(t *testing.T) {
	f, path := faultyFile(t, Only(OpWrite).WithError(unix.ENOSPC).Partial())
	want := testutil.Pattern(10000, 1)
	n, err := f.WriteAt(want, 0)
	require.Error(t, err)
	assert.True(t, IsNoSpace(err), "an injected ENOSPC is ErrNoSpace as a real one is: %v", err)
	require.ErrorIs(t, err, ErrNoSpace)
	require.ErrorIs(t, err, unix.ENOSPC, "the errno is still there")
	require.ErrorIs(t, err, ErrInjected)
	assert.Equal(t, 5000, n, "a partial failure writes the first half")
	assert.Contains(t, err.Error(), "posix: write "+path+" at 0: injected: no space left on device")
	assert.Contains(t, err.Error(), "partial write: 5000 of 10000 bytes done")
	disk, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, want[:5000], disk)
}

func TestInjectedReadOnlyIsPermission(t *testing.T) {
	e := Faulty(NewPosix(Options{}), Only(OpOpen).WithError(unix.EROFS))
	path := filepath.Join(t.TempDir(), "f")
	_, err := e.Open(path, os.O_RDWR|os.O_CREATE, 0o644)
	require.ErrorIs(t, err, unix.EROFS)
	assert.ErrorIs(t, err, fs.ErrPermission, "EROFS is a permission problem, injected or not")
	assert.Contains(t, err.Error(), "posix: open "+path)
	_, serr := os.Stat(path)
	assert.ErrorIs(t, serr, os.ErrNotExist, "an injected open failure creates nothing")
}

func TestInjectedPartialRead(t *testing.T) {
	f, _ := faultyFile(t, OnNth(1, OpRead).Partial())
	want := testutil.Pattern(8000, 2)
	_, err := f.WriteAt(want, 0)
	require.NoError(t, err)
	got := make([]byte, len(want))
	n, err := f.ReadAt(got, 0)
	require.ErrorIs(t, err, ErrInjected)
	assert.Equal(t, 4000, n)
	assert.Equal(t, want[:4000], got[:4000])
	assert.Contains(t, err.Error(), "partial read: 4000 of 8000 bytes done")
}

func TestInjectedCloseStillCloses(t *testing.T) {
	f, _ := faultyFile(t, Only(OpClose))
	require.ErrorIs(t, f.Close(), ErrInjected)
	_, err := f.(*faultFile).Unwrap().ReadAt(make([]byte, 1), 0)
	require.ErrorIs(t, err, ErrClosed, "the base file is closed even so")
}

func TestRegisterFault(t *testing.T) {
	inj := OnNth(1, OpWrite).WithError(unix.ENOSPC)
	unregister, err := RegisterFault("test-faulty", "posix", inj)
	require.NoError(t, err)
	defer unregister()
	assert.Contains(t, Names(), "test-faulty")

	e, err := New("test-faulty", Options{Name: "/shown"})
	require.NoError(t, err)
	assert.Equal(t, "test-faulty", e.Name())
	f, err := e.Open(filepath.Join(t.TempDir(), "f"), os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	defer f.Close()
	assert.Equal(t, "posix", f.Engine())
	_, err = f.WriteAt([]byte{1}, 0)
	require.True(t, IsNoSpace(err), "%v", err)
	assert.Contains(t, err.Error(), "posix: write /shown at 0", "the base gets the options")

	_, err = RegisterFault("test-faulty", "posix", Never)
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "already registered")
	_, err = RegisterFault("test-faulty-2", "floppy", Never)
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), `"floppy"`)
	assert.NotContains(t, Names(), "test-faulty-2")

	unregister()
	unregister() // idempotent
	assert.NotContains(t, Names(), "test-faulty")
	_, err = New("test-faulty", Options{})
	require.ErrorIs(t, err, ErrInvalid)
}

func TestUnregisterLeavesALaterRegistrationAlone(t *testing.T) {
	first, err := RegisterFault("test-again", "posix", Never)
	require.NoError(t, err)
	first()
	second, err := RegisterFault("test-again", "posix", Never)
	require.NoError(t, err)
	defer second()
	first()
	assert.Contains(t, Names(), "test-again")
}

func TestRegisterFaultConcurrently(t *testing.T) {
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("test-concurrent-%d", g)
			for range 50 {
				unregister, err := RegisterFault(name, "posix", Never)
				if !assert.NoError(t, err) {
					return
				}
				_, err = New(name, Options{})
				assert.NoError(t, err)
				_ = Names()
				unregister()
			}
		}()
	}
	wg.Wait()
	for _, n := range Names() {
		assert.NotContains(t, n, "test-concurrent-")
	}
}

func TestInjectedErrorKeepsCustomCause(t *testing.T) {
	custom := errors.New("disk on fire")
	f, _ := faultyFile(t, Only(OpSync).WithError(custom))
	err := f.Sync()
	require.ErrorIs(t, err, custom)
	require.ErrorIs(t, err, ErrInjected)
	assert.Contains(t, err.Error(), "injected: disk on fire")
}
