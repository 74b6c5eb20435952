package dict

import (
	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"

	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeTimes is an injected machine: the time each engine takes per
// direction, whatever the size.
type fakeTimes map[Op]map[string]time.Duration

// run asks c for n transfers of size bytes in op, observes the fake time of
// each, and returns the engines chosen.
func (f fakeTimes) run(c transfer.Chooser, op Op, size int64, n int) []string {
	var got []string
	for range n {
		e := c.Engine(op, size)
		c.Observe(op, size, e, f[op][e])
		got = append(got, e)
	}
	return got
}

var three = []string{"posix", "direct", "uring"}

func newDicts(t *testing.T, cfg DictConfig) *Dictionaries {
	t.Helper()
	if cfg.Write == nil {
		cfg.Write = three
	}
	if cfg.Read == nil {
		cfg.Read = append(three, "mmap")
	}
	d, err := NewDictionaries(cfg)
	require.NoError(t, err)
	return d
}

func count(xs []string) map[string]int {
	m := map[string]int{}
	for _, x := range xs {
		m[x]++
	}
	return m
}

func TestBucket(t *testing.T) {
	for size, want := range map[int64]int{0: 12, 1: 12, 4096: 12, 4097: 13, 1 << 20: 20, 1<<20 + 1: 21, 3 << 20: 22} {
		assert.Equal(t, want, Bucket(size), "size %d", size)
	}
	assert.Equal(t, "4K", HumanSize(BucketSize(12)))
	assert.Equal(t, "1.5M", HumanSize(3<<19))
}

func TestAwareExploresEveryCandidateThenExploits(t *testing.T) {
	f := fakeTimes{OpWrite: {"posix": 3 * time.Millisecond, "direct": time.Millisecond, "uring": 2 * time.Millisecond}}
	d := newDicts(t, DictConfig{Explore: 2})
	c := d.Chooser(UseSeparate)

	explore := f.run(c, OpWrite, 1<<20, 6)
	assert.Equal(t, map[string]int{"posix": 2, "direct": 2, "uring": 2}, count(explore))
	assert.Equal(t, []string{"posix", "direct", "uring"}, explore[:3], "round robin in preference order")
	assert.Equal(t, []string{"direct", "direct", "direct", "direct"}, f.run(c, OpWrite, 1<<20, 4))

	// Another bucket explores on its own.
	assert.Equal(t, map[string]int{"posix": 2, "direct": 2, "uring": 2}, count(f.run(c, OpWrite, 64<<20, 6)))
	dec := c.Decide(OpWrite, 1<<20)
	assert.Equal(t, "direct", dec.Engine)
	assert.False(t, dec.Exploring)
}

func TestAwareRefreshReexploresAtTheInterval(t *testing.T) {
	f := fakeTimes{OpRead: {"posix": 3 * time.Millisecond, "direct": time.Millisecond, "uring": 2 * time.Millisecond, "mmap": 4 * time.Millisecond}}
	d := newDicts(t, DictConfig{Refresh: 5})
	c := d.Chooser(UseSeparate)
	f.run(c, OpRead, 8<<20, 4) // explore the four read candidates once
	got := f.run(c, OpRead, 8<<20, 20)
	for i, e := range got {
		if (i+1)%5 == 0 {
			assert.NotEqual(t, "direct", e, "transfer %d is a refresh", i+1)
		} else {
			assert.Equal(t, "direct", e, "transfer %d exploits", i+1)
		}
	}
	assert.Equal(t, map[string]int{"direct": 16, "posix": 2, "uring": 1, "mmap": 1}, count(got))
}

func TestRefreshFindsAChangedMachine(t *testing.T) {
	f := fakeTimes{OpWrite: {"posix": time.Millisecond, "direct": 2 * time.Millisecond, "uring": 3 * time.Millisecond}}
	d := newDicts(t, DictConfig{Refresh: 3, Alpha: 1})
	c := d.Chooser(UseSeparate)
	f.run(c, OpWrite, 1<<16, 3)
	assert.Equal(t, "posix", c.Engine(OpWrite, 1<<16))
	f[OpWrite]["direct"] = time.Microsecond // direct got faster
	f.run(c, OpWrite, 1<<16, 12)
	assert.Equal(t, "direct", c.Decide(OpWrite, 1<<16).Engine)
}

func TestWriteReadPicksTheBestSum(t *testing.T) {
	ms := time.Millisecond
	// Best writer posix, best reader direct (mmap reads faster still but
	// cannot write), best pair uring.
	f := fakeTimes{
		OpWrite: {"posix": 1 * ms, "direct": 4 * ms, "uring": 2 * ms},
		OpRead:  {"posix": 4 * ms, "direct": 1 * ms, "uring": 2 * ms, "mmap": ms / 2},
	}
	d := newDicts(t, DictConfig{})
	wr, sep := d.Chooser(UseWriteRead), d.Chooser(UseSeparate)
	assert.Equal(t, []string{"posix", "direct", "uring"}, wr.Engines())
	assert.Equal(t, []string{"posix", "direct", "uring", "mmap"}, sep.Engines())

	assert.Equal(t, map[string]int{"posix": 1, "direct": 1, "uring": 1}, count(f.run(wr, OpWrite, 1<<22, 3)))
	assert.Equal(t, map[string]int{"posix": 1, "direct": 1, "uring": 1}, count(f.run(wr, OpRead, 1<<22, 3)))
	assert.Equal(t, "uring", wr.Engine(OpWrite, 1<<22))
	assert.Equal(t, "uring", wr.Engine(OpRead, 1<<22))

	// The separate dictionaries pick the best of each direction.
	assert.Equal(t, "posix", sep.Engine(OpWrite, 1<<22))
	f.run(sep, OpRead, 1<<22, 1) // mmap has not been explored yet
	assert.Equal(t, "mmap", sep.Engine(OpRead, 1<<22))

	snap := d.Snapshot()
	require.Len(t, snap.WriteRead, 1)
	assert.Equal(t, "uring", snap.WriteRead[0].Best)
	assert.InDelta(t, 0.004, snap.WriteRead[0].Engines["uring"].Seconds, 1e-9)
	assert.NotContains(t, snap.WriteRead[0].Engines, "mmap")
}

func TestWriteReadWaitsForTheFullEngineSet(t *testing.T) {
	f := fakeTimes{OpWrite: {"posix": time.Millisecond, "direct": time.Millisecond, "uring": time.Millisecond}}
	d := newDicts(t, DictConfig{})
	f.run(d.Chooser(UseSeparate), OpWrite, 1<<20, 3)
	assert.Empty(t, d.Snapshot().WriteRead, "no read samples yet")
}

func writeDictFile(t *testing.T, doc DictFile) string {
	t.Helper()
	if doc.Schema == 0 {
		doc.Schema = DictSchema
	}
	b, err := json.Marshal(doc)
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "dict.json")
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

func TestSpecificDictionaryNeverExplores(t *testing.T) {
	stat := func(s float64) EngineStat { return EngineStat{Seconds: s, Samples: 3} }
	p := writeDictFile(t, DictFile{
		Write: []DictEntry{
			{Bucket: 20, Engines: map[string]EngineStat{"posix": stat(2), "direct": stat(1)}, Best: "direct"},
			{Bucket: 26, Engines: map[string]EngineStat{"cufile": stat(0.5), "uring": stat(1), "posix": stat(2)}, Best: "cufile"},
		},
		Read: []DictEntry{{Size: 1 << 16, Best: "posix"}}, // hand-written: size and engine only
	})
	d, err := OpenDictionaries(DictConfig{Mode: ModeSpecificDict, Path: p, Write: three, Read: three})
	require.NoError(t, err)
	c := d.Chooser(UseSeparate)
	before := d.Snapshot()
	for range 20 {
		dec := c.Decide(OpWrite, 1<<20)
		assert.Equal(t, "direct", dec.Engine)
		assert.False(t, dec.Exploring)
		c.Observe(OpWrite, 1<<20, "posix", time.Nanosecond)
	}
	before.Updated = ""
	after := d.Snapshot()
	after.Updated = ""
	assert.Equal(t, before, after, "observations do not change a specific dictionary")

	dec := c.Decide(OpWrite, 64<<20)
	assert.Equal(t, "uring", dec.Engine, "cufile is missing here: the next best")
	assert.Contains(t, dec.Reason, `"cufile"`)
	assert.Contains(t, dec.Reason, "next best")

	dec = c.Decide(OpWrite, 2<<20) // no entry: the nearest bucket (1M)
	assert.Equal(t, "direct", dec.Engine)
	assert.Contains(t, dec.Reason, "nearest")
	assert.Equal(t, "posix", c.Engine(OpRead, 40000))

	// Missing or corrupt files are errors in this mode.
	_, err = OpenDictionaries(DictConfig{Mode: ModeSpecificDict, Path: p + ".missing", Write: three, Read: three})
	assert.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, os.WriteFile(p, []byte("{not json"), 0o644))
	_, err = OpenDictionaries(DictConfig{Mode: ModeSpecificDict, Path: p, Write: three, Read: three})
	assert.ErrorIs(t, err, gds.ErrInvalid)
}

func TestSpecificTool(t *testing.T) {
	d := newDicts(t, DictConfig{Mode: ModeSpecificTool, Tool: "uring"})
	c := d.Chooser(UseSeparate)
	for _, size := range []int64{1, 1 << 20, 1 << 30} {
		assert.Equal(t, "uring", c.Engine(OpWrite, size))
		assert.Equal(t, "uring", c.Engine(OpRead, size))
		c.Observe(OpWrite, size, "uring", time.Second)
	}
	assert.Empty(t, d.Snapshot().Write)

	d = newDicts(t, DictConfig{Mode: ModeSpecificTool, Tool: "mmap"})
	c = d.Chooser(UseSeparate)
	assert.Equal(t, "mmap", c.Engine(OpRead, 1<<20))
	dec := c.Decide(OpWrite, 1<<20)
	assert.Equal(t, "posix", dec.Engine)
	assert.Contains(t, dec.Reason, "cannot write")

	_, err := NewDictionaries(DictConfig{Mode: ModeSpecificTool, Write: three, Read: three})
	assert.ErrorIs(t, err, gds.ErrInvalid)
}

func TestConcurrentEngineAndObserve(t *testing.T) {
	dir := t.TempDir()
	d := newDicts(t, DictConfig{Path: filepath.Join(dir, "d.json"), Refresh: 7, SaveInterval: time.Millisecond})
	views := []*DictChooser{d.Chooser(UseSeparate), d.Chooser(UseWriteRead)}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			c := views[g%2]
			for i := range 500 {
				op := Op((g + i) % 2)
				size := int64(1) << (10 + (i % 16))
				e := c.Engine(op, size)
				c.Observe(op, size, e, time.Duration(1+i%5)*time.Microsecond)
				if i%100 == 0 {
					_ = d.Snapshot()
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, d.Close())
	d2, err := OpenDictionaries(DictConfig{Path: filepath.Join(dir, "d.json"), Write: three, Read: append(three, "mmap")})
	require.NoError(t, err)
	assert.Empty(t, d2.Warnings())
	assert.NotEmpty(t, d2.Snapshot().Write)
}

func TestJSONRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cache", "dict.json")
	key := MachineKey{Host: "h", CPU: "c", FSType: "ext4", Source: "/dev/x", Mount: "/", Device: "1:2"}
	f := fakeTimes{
		OpWrite: {"posix": time.Millisecond, "direct": 2 * time.Millisecond, "uring": 3 * time.Millisecond},
		OpRead:  {"posix": 3 * time.Millisecond, "direct": time.Millisecond, "uring": 2 * time.Millisecond, "mmap": 4 * time.Millisecond},
	}
	d := newDicts(t, DictConfig{Path: path, Key: key, SaveInterval: -1})
	c := d.Chooser(UseSeparate)
	for _, size := range []int64{4096, 1 << 20, 64 << 20} {
		f.run(c, OpWrite, size, 4)
		f.run(c, OpRead, size, 5)
	}
	require.NoError(t, d.Close())
	entries, _ := os.ReadDir(filepath.Dir(path))
	assert.Len(t, entries, 1, "no temporary file left behind")
	raw, _ := os.ReadFile(path)
	assert.Less(t, len(raw), 4096, "a few KB")

	d2, err := OpenDictionaries(DictConfig{Path: path, Key: key, Write: three, Read: append(three, "mmap")})
	require.NoError(t, err)
	assert.Empty(t, d2.Warnings())
	a, b := d.Snapshot(), d2.Snapshot()
	a.Updated, b.Updated = "", ""
	assert.Equal(t, a, b)
	assert.Len(t, b.WriteRead, 3)
	// The loaded dictionaries are already explored.
	assert.Equal(t, "posix", d2.Chooser(UseSeparate).Engine(OpWrite, 1<<20))
	assert.Equal(t, "direct", d2.Chooser(UseSeparate).Engine(OpRead, 1<<20))
}

func TestCorruptFileGivesFreshDictionariesAndAWarning(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"garbage": "\x00\x01not json at all",
		"torn":    `{"schema": 1, "write": [{"bucket": 20, "engi`,
		"schema":  `{"schema": 99, "write": []}`,
		"types":   `{"schema": 1, "write": {"bucket": "x"}}`,
	} {
		p := filepath.Join(dir, name+".json")
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
		d, err := OpenDictionaries(DictConfig{Path: p, Write: three, Read: three, SaveInterval: -1})
		require.NoError(t, err, name)
		require.Len(t, d.Warnings(), 1, name)
		assert.Contains(t, d.Warnings()[0], "starting with empty dictionaries", name)
		assert.Empty(t, d.Snapshot().Write, name)
		assert.Equal(t, "posix", d.Chooser(UseSeparate).Engine(OpWrite, 1<<20), name) // exploring again
		require.NoError(t, d.Close(), name)
	}
	// A missing file is no reason to warn.
	d, err := OpenDictionaries(DictConfig{Path: filepath.Join(dir, "none.json"), Write: three, Read: three})
	require.NoError(t, err)
	assert.Empty(t, d.Warnings())
}

func TestUnknownEngineInAFileIsIgnoredWithAReason(t *testing.T) {
	p := writeDictFile(t, DictFile{Write: []DictEntry{
		{Bucket: 20, Engines: map[string]EngineStat{"warp9": {Seconds: 0.001, Samples: 2}, "posix": {Seconds: 0.002, Samples: 2}}, Best: "warp9"},
		{Bucket: 3, Engines: map[string]EngineStat{"posix": {Seconds: 1, Samples: 1}}},
		{Bucket: 21, Engines: map[string]EngineStat{"direct": {Seconds: -1, Samples: 1}}},
	}})
	d, err := OpenDictionaries(DictConfig{Path: p, Write: three, Read: three})
	require.NoError(t, err)
	w := strings.Join(d.Warnings(), "\n")
	assert.Contains(t, w, `unknown engine "warp9" in write bucket 1M ignored`)
	assert.Contains(t, w, `unknown best engine "warp9"`)
	assert.Contains(t, w, "bucket 3")
	assert.Contains(t, w, "bad figure")
	snap := d.Snapshot()
	require.Len(t, snap.Write, 1)
	assert.Equal(t, "posix", snap.Write[0].Best)
	assert.NotContains(t, snap.Write[0].Engines, "warp9")
}

func TestDictPathAndCandidates(t *testing.T) {
	dir := t.TempDir()
	p, key, err := DictPath("/cache", dir)
	require.NoError(t, err)
	assert.Equal(t, "/cache", filepath.Dir(p))
	assert.Regexp(t, `^dict-[A-Za-z0-9._-]+-[A-Za-z0-9._-]+-[0-9a-f]{12}\.json$`, filepath.Base(p))
	assert.NotEmpty(t, key.FSType)
	assert.NotEmpty(t, key.Device)
	p2, _, _ := DictPath("/cache", dir)
	assert.Equal(t, p, p2, "stable")

	w, r, ex := Candidates(dir, gds.Options{})
	require.NotEmpty(t, w)
	assert.Equal(t, "posix", w[0])
	assert.NotContains(t, w, "mmap")
	assert.Contains(t, r, "mmap")
	for _, n := range gds.Names() {
		_, in := ex[n]
		assert.True(t, in || strings.Contains(strings.Join(r, ","), n), "%s is a candidate or excluded with a reason", n)
	}
}

// A crossed Use answers both directions from one dictionary once explored:
// UseWrite from WDic, UseRead from RDic (the offload's dictionary= "w", "r").
func TestCrossedUsesAnswerFromTheirDictionary(t *testing.T) {
	ms := time.Millisecond
	f := fakeTimes{
		OpWrite: {"posix": 1 * ms, "direct": 4 * ms, "uring": 2 * ms},
		OpRead:  {"posix": 4 * ms, "direct": 1 * ms, "uring": 2 * ms},
	}
	d := newDicts(t, DictConfig{Read: three})
	sep := d.Chooser(UseSeparate)
	f.run(sep, OpWrite, 1<<22, 3)
	f.run(sep, OpRead, 1<<22, 3)
	w, r := d.Chooser(UseWrite), d.Chooser(UseRead)
	for _, op := range []Op{OpWrite, OpRead} {
		assert.Equal(t, "posix", w.Engine(op, 1<<22), "WDic's best, op %v", op)
		assert.Equal(t, "direct", r.Engine(op, 1<<22), "RDic's best, op %v", op)
	}
}
