package dict

import (
	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"

	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Adaptive engine choice: Fastensor's three dictionaries (WDic, RDic, WRDic).
//
// A dictionary maps a size bucket to the measured time of each candidate
// engine and the best one. The bucket of a transfer of n bytes is
// ceil(log2(n)), with MinBucket (4 KiB) as the floor for smaller transfers,
// so bucket b holds sizes in (2^(b-1), 2^b].
//
// Estimate: each engine's figure is the time a transfer of exactly the
// bucket's size (2^b bytes) takes, in seconds. A sample of n bytes that took
// d counts as d*2^b/n (the factor is at most 2, also in the floor bucket,
// where small transfers cost latency rather than bandwidth). Samples are
// averaged by a running mean for the first 1/Alpha samples and then by an
// exponentially weighted moving average with weight Alpha, so the estimate
// settles fast and still follows a machine whose behaviour changes (the
// paper's section 5.2.3).
//
// The write+read dictionary is derived: for data written once and read back
// once (offloaded activations), an engine's figure is its write time plus
// its read time, and its best engine minimises that sum, which need not be
// the best writer or the best reader. A bucket enters WRDic once both WDic
// and RDic have a sample of every engine that can do both directions.

// Op is the direction of a transfer (transfer.Op).
type Op = transfer.Op

// Transfer directions.
const (
	OpWrite = transfer.OpWrite
	OpRead  = transfer.OpRead
)

// Table names one of the three dictionaries.
type Table int

// The dictionaries.
const (
	WDic  Table = iota // write times
	RDic               // read times
	WRDic              // write+read times, for data written once and read once
)

var tableNames = [...]string{"write", "read", "write_read"}

func (t Table) String() string { return tableNames[t] }

// Mode is one of Fastensor's three ways to choose an engine.
type Mode int

// Modes.
const (
	// ModeAware builds the dictionaries while running: every candidate
	// engine is tried Explore times on the first transfers of a bucket,
	// then the best is used, with an optional refresh.
	ModeAware Mode = iota
	// ModeSpecificDict uses dictionaries loaded from a file as they are:
	// no exploration, no updates.
	ModeSpecificDict
	// ModeSpecificTool uses one engine (DictConfig.Tool) for every size.
	ModeSpecificTool
)

var modeNames = [...]string{"aware", "dict", "tool"}

func (m Mode) String() string { return modeNames[m] }

// ParseMode reads "aware", "dict" or "tool".
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if s == n {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("%w: dictionary mode %q (expected aware, dict or tool)", gds.ErrInvalid, s)
}

// Buckets: MinBucket is the floor (every transfer up to 4 KiB), MaxBucket
// the ceiling.
const (
	MinBucket = 12
	MaxBucket = 62
)

// Bucket returns the size bucket of a transfer of size bytes.
func Bucket(size int64) int {
	if size <= 1<<MinBucket {
		return MinBucket
	}
	return min(bits.Len64(uint64(size-1)), MaxBucket) // ceil(log2(size))
}

// BucketSize is the largest size in bucket b (2^b bytes).
func BucketSize(b int) int64 { return int64(1) << b }

// Defaults of DictConfig.
const (
	DefaultExplore      = 1
	DefaultAlpha        = 0.25
	DefaultSaveInterval = 30 * time.Second
)

// DictConfig sets up Dictionaries.
type DictConfig struct {
	Mode Mode
	// Tool is the engine of ModeSpecificTool.
	Tool string
	// Write and Read are the candidate engines for each direction, in order
	// of preference: the first is used when nothing is known (see
	// Candidates). Both must be non-empty.
	Write, Read []string
	// Explore is the number of samples of every candidate a bucket gets
	// before the best is used (ModeAware). Default DefaultExplore.
	Explore int
	// Refresh re-explores: every Refresh-th transfer of a bucket in one
	// direction goes to a non-best candidate (round robin), once. 0 never.
	Refresh int
	// Alpha is the EWMA weight of a new sample. Default DefaultAlpha.
	Alpha float64
	// Path is the JSON file the dictionaries are kept in; "" keeps them in
	// memory only.
	Path string
	// Key identifies this machine and filesystem; it is written into the
	// file (see MachineKeyFor).
	Key MachineKey
	// SaveInterval: ModeAware saves changed dictionaries in the background
	// at most this often (after an Observe), and at Close. Default
	// DefaultSaveInterval; negative saves only on Save and Close.
	SaveInterval time.Duration
	// FS is what saves commit the file through (transfer's commit
	// protocol; see Save); nil means transfer's default (the real
	// filesystem, or what transfer.SetDefaultFS installed).
	FS transfer.FS
}

func (c DictConfig) withDefaults() (DictConfig, error) {
	if c.Explore <= 0 {
		c.Explore = DefaultExplore
	}
	if c.Alpha <= 0 || c.Alpha > 1 {
		c.Alpha = DefaultAlpha
	}
	if c.SaveInterval == 0 {
		c.SaveInterval = DefaultSaveInterval
	}
	if c.Refresh < 0 {
		return c, fmt.Errorf("%w: refresh interval %d is negative", gds.ErrInvalid, c.Refresh)
	}
	if len(c.Write) == 0 || len(c.Read) == 0 {
		return c, fmt.Errorf("%w: dictionaries need at least one candidate engine per direction (write %v, read %v)", gds.ErrInvalid, c.Write, c.Read)
	}
	if c.Mode == ModeSpecificTool && c.Tool == "" {
		return c, fmt.Errorf("%w: specific-tool mode needs a tool", gds.ErrInvalid)
	}
	c.Write, c.Read = slices.Clone(c.Write), slices.Clone(c.Read)
	return c, nil
}

// EngineStat is one engine's estimate in one bucket.
type EngineStat struct {
	// Seconds is the estimated time of a transfer of the bucket's size.
	Seconds float64 `json:"seconds"`
	// Samples is the number of transfers measured.
	Samples int64 `json:"samples"`
}

// entry is one bucket of one dictionary.
type entry struct {
	engines map[string]EngineStat
	best    string
	// Run-time state, not persisted: transfers counts the bucket's
	// exploiting transfers (for Refresh), rr and refreshRR are round-robin
	// cursors, picks counts exploration picks per engine.
	transfers int64
	rr        int
	refreshRR int
	picks     map[string]int
}

func newEntry() *entry {
	return &entry{engines: map[string]EngineStat{}, picks: map[string]int{}}
}

// bestOf returns the engine of cands with the least time in e, and whether
// any of them has a sample.
func (e *entry) bestOf(cands []string) (string, bool) {
	best, t := "", math.Inf(1)
	for _, c := range cands {
		if s, ok := e.engines[c]; ok && s.Samples > 0 && s.Seconds < t {
			best, t = c, s.Seconds
		}
	}
	return best, best != ""
}

// Decision is one engine choice and why it was made.
type Decision struct {
	Engine    string `json:"engine"`
	Table     Table  `json:"-"`
	Bucket    int    `json:"bucket"`
	Exploring bool   `json:"exploring"` // an exploration or refresh transfer
	Reason    string `json:"reason,omitempty"`
}

// Dictionaries holds the write, read and write+read dictionaries of one
// machine and filesystem. Consumers use it through Chooser views.
//
// Concurrency: every method is safe for concurrent use. A save runs outside
// the lock that Engine and Observe take.
type Dictionaries struct {
	cfg DictConfig
	wr  []string // engines that can do both directions, in write order
	// dev is the filesystem's device number (cfg.Key.Device), whose cuFile
	// verdict decides whether cufile stays a candidate; hasDev when known.
	dev    uint64
	hasDev bool

	mu       sync.Mutex
	tables   [3]map[int]*entry
	dirty    bool
	lastSave time.Time
	warnings []string

	saveMu  sync.Mutex // one save at a time
	saving  atomic.Bool
	bg      sync.WaitGroup
	saveErr error // last background save error, under mu
}

// NewDictionaries returns empty dictionaries (nothing is read from
// cfg.Path; see OpenDictionaries).
func NewDictionaries(cfg DictConfig) (*Dictionaries, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	d := &Dictionaries{cfg: cfg, lastSave: time.Now()}
	var major, minor uint32
	if _, err := fmt.Sscanf(cfg.Key.Device, "%d:%d", &major, &minor); err == nil {
		d.dev, d.hasDev = unix.Mkdev(major, minor), true
	}
	for _, w := range cfg.Write {
		if slices.Contains(cfg.Read, w) {
			d.wr = append(d.wr, w)
		}
	}
	for i := range d.tables {
		d.tables[i] = map[int]*entry{}
	}
	return d, nil
}

// Config returns the configuration in use (defaults filled in).
func (d *Dictionaries) Config() DictConfig { return d.cfg }

// Warnings lists what loading the file found wrong (ignored engines,
// a corrupt file replaced by fresh dictionaries).
func (d *Dictionaries) Warnings() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string{}, d.warnings...)
}

// Engines returns the engines table t may answer for direction op: its
// candidates, and for WRDic those that can do both directions.
func (d *Dictionaries) Engines(op Op, t Table) []string { return d.candidates(op, t) }

// candidates returns the engines table may answer for direction op.
func (d *Dictionaries) candidates(op Op, t Table) []string {
	switch {
	case t == WRDic && len(d.wr) > 0:
		return d.withoutFailedCuFile(d.wr)
	case op == OpRead:
		return d.withoutFailedCuFile(d.cfg.Read)
	}
	return d.withoutFailedCuFile(d.cfg.Write)
}

// withoutFailedCuFile drops cufile from cands once cuFile is known not to
// work on the dictionaries' filesystem (gds.CuFileFailedOn: its probe
// failed, or a file's open or transfer failed since): the dictionaries stop
// choosing it there, for the rest of the process. A lone candidate stays.
func (d *Dictionaries) withoutFailedCuFile(cands []string) []string {
	if !d.hasDev || len(cands) < 2 || !slices.Contains(cands, "cufile") {
		return cands
	}
	if _, failed := gds.CuFileFailedOn(d.dev); !failed {
		return cands
	}
	return slices.DeleteFunc(slices.Clone(cands), func(s string) bool { return s == "cufile" })
}

// Use says which dictionary answers each direction for one consumer.
type Use struct{ Write, Read Table }

// Common uses: checkpoints write by WDic and read by RDic; the offload
// spill file, whose data is written once and read back once, uses WRDic
// by default, or one of WDic and RDic for both directions (the paper's
// feature-map experiments compare the three).
var (
	UseSeparate  = Use{Write: WDic, Read: RDic}
	UseWriteRead = Use{Write: WRDic, Read: WRDic}
	UseWrite     = Use{Write: WDic, Read: WDic}
	UseRead      = Use{Write: RDic, Read: RDic}
)

// DictChooser is a consumer's view of Dictionaries: a Chooser that answers
// each direction from the dictionary its Use names. Views of the same
// Dictionaries share all measurements.
type DictChooser struct {
	d   *Dictionaries
	use Use
}

var _ transfer.Chooser = (*DictChooser)(nil)

// Chooser returns a view that answers from the dictionaries use names.
func (d *Dictionaries) Chooser(use Use) *DictChooser { return &DictChooser{d: d, use: use} }

// Engine implements Chooser.
func (c *DictChooser) Engine(op Op, size int64) string { return c.Decide(op, size).Engine }

// Decide is Engine with the reason for the choice.
func (c *DictChooser) Decide(op Op, size int64) Decision {
	t := c.use.Write
	if op == OpRead {
		t = c.use.Read
	}
	return c.d.decide(op, size, t)
}

// Observe implements Chooser.
func (c *DictChooser) Observe(op Op, size int64, engine string, d time.Duration) {
	c.d.observe(op, size, engine, d)
}

// Engines lists every engine this view may name, first the fallback (the
// offload store opens one file per engine).
func (c *DictChooser) Engines() []string {
	w := c.d.candidates(OpWrite, c.use.Write)
	out := slices.Clone(w)
	for _, r := range c.d.candidates(OpRead, c.use.Read) {
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	if c.d.cfg.Mode == ModeSpecificTool && !slices.Contains(out, c.d.cfg.Tool) {
		out = append(out, c.d.cfg.Tool)
	}
	return out
}

func (d *Dictionaries) decide(op Op, size int64, t Table) Decision {
	b := Bucket(size)
	cands := d.candidates(op, t)
	dec := Decision{Table: t, Bucket: b}
	switch d.cfg.Mode {
	case ModeSpecificTool:
		dec.Engine = d.cfg.Tool
		if !slices.Contains(cands, d.cfg.Tool) {
			dec.Engine = cands[0]
			dec.Reason = fmt.Sprintf("tool %q cannot %s here; using %q", d.cfg.Tool, op, cands[0])
		}
		return dec
	case ModeSpecificDict:
		d.mu.Lock()
		defer d.mu.Unlock()
		dec.Engine, dec.Reason = d.lookup(t, b, cands)
		return dec
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.aware(op, t, b, cands)
}

// lookup answers from a loaded dictionary as it is: the bucket's best
// engine, else (engine missing here) the bucket's next best, else the
// nearest bucket's answer, else the first candidate.
func (d *Dictionaries) lookup(t Table, b int, cands []string) (string, string) {
	tab := d.tables[t]
	e, at := tab[b], b
	if e == nil {
		for dist := 1; dist <= MaxBucket && e == nil; dist++ {
			if e = tab[b+dist]; e != nil {
				at = b + dist
			} else if e = tab[b-dist]; e != nil {
				at = b - dist
			}
		}
		if e == nil {
			return cands[0], fmt.Sprintf("the %s dictionary is empty; using %q", t, cands[0])
		}
	}
	reason := ""
	if at != b {
		reason = fmt.Sprintf("no %s entry for %s; using the nearest, %s", t, HumanSize(BucketSize(b)), HumanSize(BucketSize(at)))
	}
	if slices.Contains(cands, e.best) {
		return e.best, reason
	}
	next, ok := e.bestOf(cands)
	if !ok {
		next = cands[0]
	}
	if e.best == "" && ok {
		return next, reason
	}
	why := fmt.Sprintf("best engine %q of %s bucket %s is not available here; using the next best, %q",
		e.best, t, HumanSize(BucketSize(at)), next)
	if reason != "" {
		why = reason + "; " + why
	}
	return next, why
}

// aware explores, then exploits with refresh. Exploration and refresh
// happen in the direction's own dictionary (WRDic has no samples of its
// own); exploitation answers from t (WRDic, or the other direction's
// dictionary for a crossed Use), else from the direction's own. Called
// with d.mu held.
func (d *Dictionaries) aware(op Op, t Table, b int, cands []string) Decision {
	dir := WDic
	if op == OpRead {
		dir = RDic
	}
	e := d.tables[dir][b]
	if e == nil {
		e = newEntry()
		d.tables[dir][b] = e
	}
	dec := Decision{Table: t, Bucket: b}
	if c := e.nextExplore(cands, d.cfg.Explore); c != "" {
		dec.Engine, dec.Exploring = c, true
		dec.Reason = fmt.Sprintf("exploring %q for %s %s", c, op, HumanSize(BucketSize(b)))
		return dec
	}
	best, ok := "", false
	if src := d.tables[t][b]; src != nil { // t may differ from dir: WRDic, or a Use that crosses
		best, ok = src.bestOf(cands)
	}
	if !ok {
		best, ok = e.bestOf(cands)
	}
	if !ok {
		best = cands[0]
		dec.Reason = fmt.Sprintf("no candidate measured for %s %s; using %q", op, HumanSize(BucketSize(b)), best)
	}
	dec.Engine = best
	e.transfers++
	if d.cfg.Refresh > 0 && e.transfers%int64(d.cfg.Refresh) == 0 && len(cands) > 1 {
		for range cands {
			c := cands[e.refreshRR%len(cands)]
			e.refreshRR++
			if c != best {
				dec.Engine, dec.Exploring = c, true
				dec.Reason = fmt.Sprintf("refresh: re-exploring %q for %s %s", c, op, HumanSize(BucketSize(b)))
				break
			}
		}
	}
	return dec
}

// nextExplore returns the next candidate, round robin, with fewer than k
// samples, or "" when all have k. A candidate picked 2k+4 times without
// reaching k samples (its transfers fail, or are never observed) is
// skipped, so a broken engine is not retried forever.
func (e *entry) nextExplore(cands []string, k int) string {
	for i := range cands {
		c := cands[(e.rr+i)%len(cands)]
		if e.engines[c].Samples < int64(k) && e.picks[c] < 2*k+4 {
			e.rr = (e.rr + i + 1) % len(cands)
			e.picks[c]++
			return c
		}
	}
	return ""
}

func (d *Dictionaries) observe(op Op, size int64, engine string, dur time.Duration) {
	if d.cfg.Mode != ModeAware || dur < 0 {
		return // the other modes use their dictionaries as they are
	}
	dir := WDic
	if op == OpRead {
		dir = RDic
	}
	cands := d.candidates(op, dir)
	if !slices.Contains(cands, engine) {
		return // a fallback or a stranger: not ours to measure
	}
	b := Bucket(size)
	scale := min(float64(BucketSize(b))/float64(max(size, 1)), 2)
	x := dur.Seconds() * scale

	d.mu.Lock()
	e := d.tables[dir][b]
	if e == nil {
		e = newEntry()
		d.tables[dir][b] = e
	}
	s := e.engines[engine]
	s.Samples++
	w := max(d.cfg.Alpha, 1/float64(s.Samples)) // running mean first, then EWMA
	s.Seconds += w * (x - s.Seconds)
	e.engines[engine] = s
	e.best, _ = e.bestOf(cands)
	d.deriveWR(b)
	d.dirty = true
	start := d.cfg.Path != "" && d.cfg.SaveInterval > 0 && time.Since(d.lastSave) >= d.cfg.SaveInterval
	d.mu.Unlock()

	if start && d.saving.CompareAndSwap(false, true) {
		d.bg.Add(1)
		go func() {
			defer d.bg.Done()
			defer d.saving.Store(false)
			err := d.Save()
			d.mu.Lock()
			d.saveErr = err
			d.mu.Unlock()
		}()
	}
}

// deriveWR rebuilds WRDic's bucket b from WDic and RDic once both have a
// sample of every engine that can do both directions. Called with d.mu held.
func (d *Dictionaries) deriveWR(b int) {
	w, r := d.tables[WDic][b], d.tables[RDic][b]
	if w == nil || r == nil || len(d.wr) == 0 {
		return
	}
	out := newEntry()
	for _, c := range d.wr {
		ws, rs := w.engines[c], r.engines[c]
		if ws.Samples == 0 || rs.Samples == 0 {
			return
		}
		out.engines[c] = EngineStat{Seconds: ws.Seconds + rs.Seconds, Samples: min(ws.Samples, rs.Samples)}
	}
	out.best, _ = out.bestOf(d.wr)
	d.tables[WRDic][b] = out
}
