package transfer

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/internal/testutil"
)

func TestCRCCombine(t *testing.T) {
	a, b := testutil.Pattern(1000, 1), testutil.Pattern(777, 2)
	whole := crc32.ChecksumIEEE(append(append([]byte{}, a...), b...))
	assert.Equal(t, whole, Combine(Checksum(a), Checksum(b), int64(len(b))))
	assert.Equal(t, Checksum(a), Combine(Checksum(a), 0, 0))
}

func TestCRCCombineManyLengths(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 8, 255, 4096, 70001, 1 << 20} {
		a, b := testutil.Pattern(333, uint64(n)), testutil.Pattern(n, uint64(n)+1)
		whole := crc32.ChecksumIEEE(append(append([]byte{}, a...), b...))
		assert.Equal(t, whole, Combine(Checksum(a), Checksum(b), int64(n)), n)
		assert.Equal(t, whole, Combine(Checksum(a), Checksum(b), int64(n)), "cached operator, %d", n)
	}
	zero := make([]byte, 100) // CRC of 100 zero bytes is not zero: crc1 == 0 needs A with that CRC
	assert.NotZero(t, Checksum(zero))
	b := testutil.Pattern(5000, 9)
	assert.Equal(t, Checksum(b), Combine(0, Checksum(b), 5000))
}

func TestPageSumsJoinToEachRangesCRC(t *testing.T) {
	data := testutil.Pattern(5*Page+123, 9)
	g := NewPageSums(data)
	g.sumPages(data, 0)
	ranges := [][2]int64{{0, 0}, {0, int64(len(data))}, {0, Page}, {Page, 2 * Page}, {1, Page - 1},
		{Page - 1, 2}, {100, 3 * Page}, {2 * Page, int64(len(data)) - 2*Page}, {int64(len(data)) - 5, 5}}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		off := r.Int64N(int64(len(data)))
		ranges = append(ranges, [2]int64{off, r.Int64N(int64(len(data)) - off + 1)})
	}
	for _, rg := range ranges {
		require.Equal(t, Checksum(data[rg[0]:rg[0]+rg[1]]), g.CRC(rg[0], rg[1]), "%d bytes at %d", rg[1], rg[0])
	}
}

// A panicking task fails its call with an internal error; the other tasks
// stop, and the process (and later calls) go on.
func TestTaskPanicFailsTheCallOnly(t *testing.T) {
	var ran atomic.Int64
	err := Run(10, 4, func(i int) error {
		ran.Add(1)
		if i == 3 {
			panic("boom")
		}
		return nil
	})
	require.ErrorIs(t, err, gds.ErrInternal)
	assert.Contains(t, err.Error(), "boom")
	assert.Contains(t, err.Error(), "panic in a worker goroutine")
	require.NoError(t, Run(5, 2, func(int) error { return nil }), "the pool works after a panic")
}

func TestRunReturnsTheLowestFailedTask(t *testing.T) {
	err := Run(100, 1, func(i int) error {
		if i >= 7 {
			return fmt.Errorf("task %d", i)
		}
		return nil
	})
	require.EqualError(t, err, "task 7")
}

func TestRawRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.bin")
	a, b := testutil.Pattern(3<<20+5, 1), testutil.Pattern(777, 2)
	_, _, err := WriteFile(path, 8+int64(len(a)+len(b)), []Extent{{Off: 8, Data: a}, {Off: 8 + int64(len(a)), Data: b}}, true, nil, Options{})
	require.NoError(t, err)
	ga, gb := make([]byte, len(a)), make([]byte, len(b))
	res, _, err := Read(path, []Extent{{Off: 8, Data: ga, Sum: true}, {Off: 8 + int64(len(a)), Data: gb}}, Options{})
	require.NoError(t, err)
	assert.Equal(t, a, ga)
	assert.Equal(t, b, gb)
	assert.Equal(t, Checksum(a), res[0].CRC)
	_, _, err = Read(path, []Extent{{Off: 8 + int64(len(a)) + 700, Data: make([]byte, 100)}}, Options{})
	require.ErrorIs(t, err, gds.ErrEOF)
	var ee *ExtentError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 0, ee.Ext)
}

// Extents packed without alignment share blocks: a large one written
// direct (its edge blocks read, patched and written back) and a small
// neighbour written through the page cache must not lose each other's
// bytes, whatever order the workers take them in.
func TestRawPackedExtentsOfMixedEnginesKeepEveryByte(t *testing.T) {
	dir := t.TempDir()
	if !Probe(dir).Direct {
		t.Skip("no O_DIRECT in the temporary directory: the mixed-engine case cannot arise")
	}
	for trial := 0; trial < 20; trial++ {
		var extents []Extent
		off := int64(0)
		for i := 0; i < 24; i++ {
			n := 15
			if i%2 == 0 {
				n = 1<<20 + 4096*i + 13 // direct under the default chooser
			}
			extents = append(extents, Extent{Off: off, Data: testutil.Pattern(n, uint64(trial*100+i))})
			off += int64(n)
		}
		path := filepath.Join(dir, fmt.Sprintf("packed%d.bin", trial))
		_, st, err := WriteFile(path, off, extents, false, nil, Options{})
		require.NoError(t, err)
		require.Contains(t, st.Engines, "direct", "the large extents went direct")
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		for i, e := range extents {
			require.True(t, bytes.Equal(e.Data, got[e.Off:e.Off+int64(len(e.Data))]),
				"trial %d extent %d (%d bytes at %d) lost bytes; engines %v", trial, i, len(e.Data), e.Off, st.Engines)
		}
	}
}

// deadPid returns the pid of a process that has ended.
func deadPid(t *testing.T) int {
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	return cmd.Process.Pid
}

func TestStaleTempFilesOfDeadProcessesAreRemoved(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "ck.pt")
	dead := deadPid(t)
	stale := filepath.Join(dir, fmt.Sprintf("%s%d-abc", tempPrefix(target), dead))
	mine := filepath.Join(dir, fmt.Sprintf("%s%d-abc", tempPrefix(target), os.Getpid()))
	other := filepath.Join(dir, fmt.Sprintf(".other.pt%s%d-abc", tempMarker, dead))
	for _, p := range []string{stale, mine, other} {
		require.NoError(t, os.WriteFile(p, nil, 0o644))
	}
	_, _, err := WriteFile(target, 10, []Extent{{Data: []byte("0123456789")}}, false, nil, Options{})
	require.NoError(t, err)
	assert.NoFileExists(t, stale)
	assert.FileExists(t, mine)
	assert.FileExists(t, other)
	assert.True(t, IsTempName(filepath.Base(stale)))
}

func TestStaleTempFilesOfAnotherPidNamespaceWaitADay(t *testing.T) {
	// On a shared filesystem a pid of another host's save says nothing
	// here: its temporary file stays while it was modified within a day,
	// whether or not a process of this host has that pid.
	dir := t.TempDir()
	target := filepath.Join(dir, "ck.pt")
	dead := deadPid(t)
	ours := filepath.Join(dir, fmt.Sprintf("%s%d@%s-abc", tempPrefix(target), dead, pidSpace()))
	foreign := fmt.Sprintf("%s%%d@%s-abc", tempPrefix(target), "0badf00d")
	require.NotEqual(t, "0badf00d", pidSpace())
	writing := filepath.Join(dir, fmt.Sprintf(foreign, dead))
	alive := filepath.Join(dir, fmt.Sprintf(foreign, os.Getpid()+1_000_000))
	left := filepath.Join(dir, fmt.Sprintf(foreign, os.Getpid()))
	for _, p := range []string{ours, writing, alive, left} {
		require.NoError(t, os.WriteFile(p, nil, 0o644))
	}
	old := time.Now().Add(-foreignStaleAge - time.Hour)
	require.NoError(t, os.Chtimes(left, old, old))
	assert.ElementsMatch(t, []string{ours, left}, CleanStale(target))
	assert.FileExists(t, writing)
	assert.FileExists(t, alive)

	// A save's own temporary name carries this process's pid and namespace.
	pid, space, ok := tempPid(target, filepath.Base(tempPath(target)))
	assert.True(t, ok)
	assert.Equal(t, os.Getpid(), pid)
	assert.Equal(t, pidSpace(), space)
	assert.Regexp(t, `^[0-9a-f]{8}$`, space)
}

func TestSavesToLongNamesUpToNameMax(t *testing.T) {
	// A legal name of up to 255 bytes: the temporary name shortens it and
	// still fits NAME_MAX; a save leaves the file and nothing else.
	dir := t.TempDir()
	for _, base := range []string{
		strings.Repeat("c", tempBaseMax-3) + ".pt", // the longest carried whole
		strings.Repeat("c", tempBaseMax-2) + ".pt",
		strings.Repeat("c", 240) + ".pt",
		strings.Repeat("é", 126) + ".pt", // 255 bytes, a cut inside a character would split one
		strings.Repeat("c", 252) + ".pt",
	} {
		target := filepath.Join(dir, base)
		tmp := filepath.Base(tempPath(target))
		assert.LessOrEqual(t, len(tmp), nameMax, "%d-byte name", len(base))
		assert.True(t, utf8.ValidString(tmp), tmp)
		assert.True(t, IsTempName(tmp), tmp)
		if len(base) <= tempBaseMax {
			assert.True(t, strings.HasPrefix(tmp, "."+base+tempMarker), tmp)
		} else {
			short, _ := TempTarget(tmp)
			assert.True(t, strings.HasSuffix(short, ".pt") && strings.HasPrefix(short, base[:100]), short)
		}
		data := testutil.Pattern(10000, uint64(len(base)))
		_, _, err := WriteFile(target, int64(len(data)), []Extent{{Data: data}}, true, nil, Options{})
		require.NoError(t, err, "%d-byte name", len(base))
		got, err := os.ReadFile(target)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(data, got), "%d-byte name", len(base))
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 5)
	for _, e := range entries {
		assert.False(t, IsTempName(e.Name()), "temporary file %s left behind", e.Name())
	}
}

func TestStaleTempFilesOfLongNamesAreRemoved(t *testing.T) {
	dir := t.TempDir()
	base := strings.Repeat("c", 215) + ".pt" // shortened in temporary names
	target := filepath.Join(dir, base)
	twin := filepath.Join(dir, strings.Repeat("c", 215)+"x.pt") // the same start and end, another name
	require.NotEqual(t, tempPrefix(target), tempPrefix(twin))
	dead := deadPid(t)
	stale := filepath.Join(dir, fmt.Sprintf("%s%d-abc", tempPrefix(target), dead))
	whole := filepath.Join(dir, fmt.Sprintf(".%s%s%d-abc", base, tempMarker, dead)) // as versions before wrote it
	// as the versions without a pid namespace wrote it, shortened less
	less := filepath.Join(dir, fmt.Sprintf(".%s%s%d-abc", shortened(base, tempBaseMaxNoSpace), tempMarker, dead))
	require.NotEqual(t, shortened(base, tempBaseMaxNoSpace), tempBase(base))
	mine := filepath.Join(dir, fmt.Sprintf("%s%d-abc", tempPrefix(target), os.Getpid()))
	other := filepath.Join(dir, fmt.Sprintf("%s%d-abc", tempPrefix(twin), dead))
	for _, p := range []string{stale, whole, less, mine, other} {
		require.LessOrEqual(t, len(filepath.Base(p)), nameMax)
		require.NoError(t, os.WriteFile(p, nil, 0o644))
	}
	_, _, err := WriteFile(target, 10, []Extent{{Data: []byte("0123456789")}}, false, nil, Options{})
	require.NoError(t, err)
	assert.NoFileExists(t, stale)
	assert.NoFileExists(t, whole)
	assert.NoFileExists(t, less)
	assert.FileExists(t, mine)
	assert.FileExists(t, other)

	// What TempTarget gives for a shortened name cleans the same files (as CommitDCP does).
	short, ok := TempTarget(filepath.Base(other))
	require.True(t, ok)
	assert.Equal(t, []string{other}, CleanStale(filepath.Join(dir, short)))
}

func TestSaveToATooLongNameIsENAMETOOLONG(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, strings.Repeat("c", nameMax+1))
	_, _, err := WriteFile(target, 10, []Extent{{Data: []byte("0123456789")}}, true, nil, Options{})
	require.ErrorIs(t, err, syscall.ENAMETOOLONG)
	assert.Contains(t, err.Error(), target)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing is written")
}

// A save over a directory is refused before a byte is written (the
// rename would refuse it only at the end).
func TestSaveOverADirectoryIsEISDIR(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "ckpt.pt")
	require.NoError(t, os.Mkdir(target, 0o755))
	_, _, err := WriteFile(target, 10, []Extent{{Data: []byte("0123456789")}}, true, nil, Options{})
	require.ErrorIs(t, err, syscall.EISDIR)
	assert.Contains(t, err.Error(), target)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "nothing but the directory")
}

// The chooser learns each extent's time once, when its last piece lands,
// and reads with Sum give each extent's CRC-32 whatever its piece count.
type recorder struct {
	Fixed
	seen atomic.Int64
}

func (r *recorder) Observe(op Op, size int64, engine string, d time.Duration) { r.seen.Add(1) }

func TestReadSumsAndObservesPerExtent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.bin")
	data := testutil.Pattern(5<<20+77, 3)
	_, _, err := WriteFile(path, int64(len(data)), []Extent{{Data: data}}, false, nil, Options{Chooser: Fixed("posix")})
	require.NoError(t, err)
	rec := &recorder{Fixed: "posix"}
	exts := []Extent{{Off: 0, Data: make([]byte, 3<<20), Sum: true}, {Off: 3 << 20, Data: make([]byte, len(data)-3<<20), Sum: true}}
	res, st, err := Read(path, exts, Options{Chooser: rec, Engine: gds.Options{TaskSize: 1 << 20}})
	require.NoError(t, err)
	assert.Equal(t, int64(2), rec.seen.Load())
	assert.Equal(t, Checksum(data[:3<<20]), res[0].CRC)
	assert.Equal(t, Checksum(data[3<<20:]), res[1].CRC)
	assert.Equal(t, map[string]int64{"posix": int64(len(data))}, st.Engines)
}

func TestWriteErrorNamesTheExtentAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "x.bin")
	require.NoError(t, os.WriteFile(target, []byte("old"), 0o644))
	_, _, err := WriteFile(target, 10, []Extent{{Off: 0, Data: []byte("0123")}, {Off: 4, Data: []byte("45")}},
		true, nil, Options{Chooser: Fixed("no-such-engine")})
	require.ErrorIs(t, err, gds.ErrInvalid)
	assert.Contains(t, err.Error(), "no-such-engine")
	got, _ := os.ReadFile(target)
	assert.Equal(t, "old", string(got))
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		assert.False(t, strings.Contains(e.Name(), tempMarker), "temporary file %s left behind", e.Name())
	}
	var ee *ExtentError
	require.True(t, errors.As(err, &ee))
}

func TestCRCSpeedMeasures(t *testing.T) {
	s := CRCSpeed(64<<10, 20*time.Millisecond)
	assert.Greater(t, s, 50e6, "CRC-32 of a cached block at %.0f B/s", s)
}

// A page-cache read summed in ReadSumChunk steps gives each extent's
// CRC-32 whatever its length and its memory's alignment.
func TestReadSummedInStepsMatchesChecksum(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.bin")
	data := testutil.Pattern(3*ReadSumChunk+12345, 5)
	_, _, err := WriteFile(path, int64(len(data)), []Extent{{Data: data}}, false, nil, Options{Chooser: Fixed("posix")})
	require.NoError(t, err)
	mem := make([]byte, len(data)+1)
	exts := []Extent{
		{Off: 0, Data: mem[1 : 1+ReadSumChunk+7], Sum: true}, // not page-aligned
		{Off: ReadSumChunk + 7, Data: mem[1+ReadSumChunk+7:], Sum: true},
	}
	res, _, err := Read(path, exts, Options{Chooser: Fixed("posix")})
	require.NoError(t, err)
	assert.Equal(t, data, mem[1:])
	assert.Equal(t, Checksum(data[:ReadSumChunk+7]), res[0].CRC)
	assert.Equal(t, Checksum(data[ReadSumChunk+7:]), res[1].CRC)
}

// The records' file alignment and the memory alignment Python lays out
// pinned buffers with both come from gds.DirectAlign, and Settings reports
// both to Python under the names it reads.
func TestSettingsReportTheDirectIOAlignment(t *testing.T) {
	s := Settings()
	assert.Equal(t, gds.DirectAlign, s["memory_alignment"])
	assert.Equal(t, Alignment, s["alignment"])
}
