// Package hitrate measures how close the adaptive dictionaries of package
// dict come to the oracle on a mixed-size workload: a benchmark, run by the
// dicthitrate command (go run ./cmd/dicthitrate), not linked into the
// library.
package hitrate

import (
	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer/dict"

	"cmp"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// The hit-rate report: how close the aware dictionaries come to the oracle
// on a mixed-size workload (Fastensor section 5.2.3, where the dictionaries
// reached 88.5-89.2% of the optimum).
//
// Method. A workload of training-like iterations is laid out in one file:
// Sizes distinct transfer sizes, log-spaced from MinSize to MaxSize with a
// random shrink of up to 25% (so sizes fall anywhere in their buckets), each
// transferred once per iteration in a shuffled order. Every transfer is
// measured with every candidate engine, in an order rotated per transfer:
// a write is WriteAt plus Sync (the data is on disk when it ends); a read
// starts cold, its range dropped from the page cache first (fadvise
// DONTNEED after the Sync; the mmap engine is reopened per read so that its
// mapping does not pin pages). The file is filled once beforehand, so every
// timed write overwrites allocated blocks.
//
// Then the dictionaries are replayed over the measured times: each
// iteration writes its transfers in order and reads them back in reverse
// order (as backpropagation reads activations), the chooser names an
// engine, is charged that engine's measured time for that transfer and
// observes it. The oracle is charged, for each transfer, the least time any
// engine took on it. Hit rate = oracle time / chosen time; "oracle choice"
// is the fraction of transfers where the chooser named the oracle's engine.

// Config sets up Run. Zero fields take the defaults in brackets.
type Config struct {
	Dir         string   // where the workload file is made (and removed)
	Write, Read []string // candidate engines [Candidates(Dir)]
	Sizes       int      // distinct sizes [16]
	Iterations  int      // iterations [12], fewer when over Budget
	MinSize     int64    // [4 KiB]
	MaxSize     int64    // [64 MiB]
	Budget      int64    // workload bytes per direction [1.5 GiB]
	Explore     int      // DictConfig.Explore [DefaultExplore]
	Refresh     int      // DictConfig.Refresh [0]
	Repeat      int      // measurements per engine and transfer; the median counts [3]
	Seed        uint64   // workload randomness [1]
	DropCaches  bool     // write 3 to /proc/sys/vm/drop_caches first (root)
	Options     gds.Options
}

// Result is one strategy's score in one direction.
type Result struct {
	Strategy      string  `json:"strategy"`  // "aware", "tool:posix", ...
	Direction     string  `json:"direction"` // "write", "read", "write+read (separate)", "write_read (WRDic)"
	Transfers     int     `json:"transfers"`
	ChosenSeconds float64 `json:"chosen_seconds"`
	OracleSeconds float64 `json:"oracle_seconds"`
	HitRate       float64 `json:"hit_rate"`
	OracleChoice  float64 `json:"oracle_choice"`
}

// BucketResult details the aware dictionaries per bucket and direction.
type BucketResult struct {
	Direction string  `json:"direction"`
	Bucket    int     `json:"bucket"`
	Size      string  `json:"size"`
	Transfers int     `json:"transfers"`
	Oracle    string  `json:"oracle"` // the engine most often best
	Chosen    string  `json:"chosen"` // the engine the dictionary ended with
	HitRate   float64 `json:"hit_rate"`
}

// Report is Run's result.
type Report struct {
	Dir            string            `json:"dir"`
	FSType         string            `json:"fs_type"`
	Write          []string          `json:"write_engines"`
	Read           []string          `json:"read_engines"`
	Excluded       map[string]string `json:"excluded,omitempty"`
	Sizes          []int64           `json:"sizes"`
	Iterations     int               `json:"iterations"`
	Transfers      int               `json:"transfers"` // per direction
	Bytes          int64             `json:"bytes"`     // per direction
	Explore        int               `json:"explore"`
	Refresh        int               `json:"refresh"`
	DroppedCaches  bool              `json:"dropped_caches"`
	MeasureSeconds float64           `json:"measure_seconds"`
	Results        []Result          `json:"results"`
	Buckets        []BucketResult    `json:"buckets"`
	Dictionaries   dict.DictFile     `json:"dictionaries"`
}

func (c Config) withDefaults() Config {
	def := func(v *int64, d int64) {
		if *v <= 0 {
			*v = d
		}
	}
	if c.Sizes <= 1 {
		c.Sizes = 16
	}
	if c.Iterations <= 0 {
		c.Iterations = 12
	}
	def(&c.MinSize, 4<<10)
	def(&c.MaxSize, 64<<20)
	def(&c.Budget, 3<<29)
	if c.Explore <= 0 {
		c.Explore = dict.DefaultExplore
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Repeat <= 0 {
		c.Repeat = 3
	}
	return c
}

// workload returns the distinct sizes and the transfer order (indices into
// sizes, iteration after iteration).
func (c Config) workload() (sizes []int64, iters [][]int) {
	rng := rand.New(rand.NewPCG(c.Seed, 0x5eed))
	ratio := float64(c.MaxSize) / float64(c.MinSize)
	var sum int64
	for j := range c.Sizes {
		base := float64(c.MinSize) * math.Pow(ratio, float64(j)/float64(c.Sizes-1))
		s := int64(base*(0.75+0.25*rng.Float64())) &^ 3 // whole float32s
		sizes = append(sizes, max(s, 4))
		sum += s
	}
	n := c.Iterations
	for n > 2 && int64(n)*sum > c.Budget {
		n--
	}
	for range n {
		iters = append(iters, rng.Perm(len(sizes)))
	}
	return sizes, iters
}

// Run measures the workload in cfg.Dir and scores the dictionaries
// against the oracle. It needs about Budget bytes free in Dir, and removes
// its file.
func Run(cfg Config) (Report, error) {
	cfg = cfg.withDefaults()
	rep := Report{Dir: cfg.Dir, Explore: cfg.Explore, Refresh: cfg.Refresh}
	rep.FSType, _ = gds.FSType(cfg.Dir)
	if cfg.Write == nil || cfg.Read == nil {
		w, r, ex := dict.Candidates(cfg.Dir, cfg.Options)
		rep.Excluded = ex
		if cfg.Write == nil {
			cfg.Write = w
		}
		if cfg.Read == nil {
			cfg.Read = r
		}
	}
	cfg.Write = slices.DeleteFunc(cfg.Write, func(s string) bool { return s == "cufile" }) // host memory here
	cfg.Read = slices.DeleteFunc(cfg.Read, func(s string) bool { return s == "cufile" })
	if slices.Contains(cfg.Write, "mmap") {
		return rep, fmt.Errorf("%w: mmap cannot write", gds.ErrInvalid)
	}
	if len(cfg.Write) == 0 || len(cfg.Read) == 0 {
		return rep, fmt.Errorf("%w: no candidate engines (write %v, read %v)", gds.ErrInvalid, cfg.Write, cfg.Read)
	}
	rep.Write, rep.Read = cfg.Write, cfg.Read
	sizes, iters := cfg.workload()
	rep.Sizes, rep.Iterations = sizes, len(iters)

	// Layout: transfer k of the flattened order at offs[k], on a
	// gds.DirectAlign boundary.
	var order []int
	for _, it := range iters {
		order = append(order, it...)
	}
	offs := make([]int64, len(order))
	var end int64
	for k, j := range order {
		offs[k] = end
		end += (sizes[j] + gds.DirectAlign - 1) &^ (gds.DirectAlign - 1)
		rep.Bytes += sizes[j]
	}
	rep.Transfers = len(order)

	if cfg.DropCaches {
		unix.Sync()
		rep.DroppedCaches = os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0) == nil
	}
	start := time.Now()
	tw, tr, err := measure(cfg, sizes, order, offs, end)
	if err != nil {
		return rep, err
	}
	rep.MeasureSeconds = time.Since(start).Seconds()

	r := replayer{cfg: cfg, sizes: sizes, iters: iters, tw: tw, tr: tr}
	res, buckets, dicts, err := r.aware()
	if err != nil {
		return rep, err
	}
	rep.Results, rep.Buckets, rep.Dictionaries = res, buckets, dicts
	rep.Results = append(rep.Results, r.hindsight()...)
	rep.Results = append(rep.Results, r.tools()...)
	return rep, nil
}

// measure times every engine on every transfer: tw[engine][k], tr[engine][k]
// in seconds.
func measure(cfg Config, sizes []int64, order []int, offs []int64, end int64) (tw, tr map[string][]float64, err error) {
	f, err := os.CreateTemp(cfg.Dir, ".pyfastensor-hitrate-*")
	if err != nil {
		return nil, nil, err
	}
	path := f.Name()
	defer os.Remove(path)
	defer f.Close()
	buf := gds.AlignedBuf(int(slices.Max(sizes)), gds.DirectAlign)
	rng := rand.New(rand.NewPCG(cfg.Seed, 7))
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	for off := int64(0); off < end; off += int64(len(buf)) { // allocate every block
		if _, err := f.WriteAt(buf[:min(int64(len(buf)), end-off)], off); err != nil {
			return nil, nil, err
		}
	}
	if err := f.Sync(); err != nil {
		return nil, nil, err
	}
	fd := int(f.Fd())

	engines := map[string]gds.Engine{}
	files := map[string]gds.File{}
	defer func() {
		for _, h := range files {
			h.Close()
		}
	}()
	for _, n := range append(slices.Clone(cfg.Write), cfg.Read...) {
		if engines[n] != nil {
			continue
		}
		if engines[n], err = gds.New(n, cfg.Options); err != nil {
			return nil, nil, err
		}
		if n != "mmap" { // mmap is opened per read, see above
			if files[n], err = engines[n].Open(path, os.O_RDWR, 0); err != nil {
				return nil, nil, err
			}
		}
	}
	tw, tr = map[string][]float64{}, map[string][]float64{}
	for k, j := range order {
		p, off := buf[:sizes[j]], offs[k]
		w, r := map[string][]float64{}, map[string][]float64{}
		for rep := range cfg.Repeat {
			for i := range cfg.Write {
				n := cfg.Write[(i+k+rep)%len(cfg.Write)]
				t0 := time.Now()
				if _, err := files[n].WriteAt(p, off); err != nil {
					return nil, nil, err
				}
				if err := files[n].Sync(); err != nil {
					return nil, nil, err
				}
				w[n] = append(w[n], time.Since(t0).Seconds())
			}
			for i := range cfg.Read {
				n := cfg.Read[(i+k+rep)%len(cfg.Read)]
				t, err := coldRead(engines[n], files[n], path, fd, p, off)
				if err != nil {
					return nil, nil, err
				}
				r[n] = append(r[n], t)
			}
		}
		for n, v := range w {
			tw[n] = append(tw[n], median(v))
		}
		for n, v := range r {
			tr[n] = append(tr[n], median(v))
		}
	}
	return tw, tr, nil
}

// coldRead drops [off, off+len(p)) from the page cache and times one read
// of it with engine e, through h, or through a file opened for the read
// when h is nil (mmap: a mapping kept open would pin the pages).
func coldRead(e gds.Engine, h gds.File, path string, fd int, p []byte, off int64) (float64, error) {
	if err := unix.Fadvise(fd, off, int64(len(p)), unix.FADV_DONTNEED); err != nil {
		return 0, fmt.Errorf("dropping %s from the page cache: %w", path, err)
	}
	if h == nil {
		f, err := e.Open(path, os.O_RDONLY, 0)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		h = f
	}
	t0 := time.Now()
	_, err := h.ReadAt(p, off)
	return time.Since(t0).Seconds(), err
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// replayer scores strategies over measured times.
type replayer struct {
	cfg    Config
	sizes  []int64
	iters  [][]int
	tw, tr map[string][]float64
}

// score accumulates one strategy in one direction.
type score struct {
	chosen, oracle float64
	n, hits        int
}

func (s *score) add(chosen, oracle float64, hit bool) {
	s.chosen += chosen
	s.oracle += oracle
	s.n++
	if hit {
		s.hits++
	}
}

func (s score) result(strategy, direction string) Result {
	r := Result{Strategy: strategy, Direction: direction, Transfers: s.n, ChosenSeconds: s.chosen, OracleSeconds: s.oracle}
	if s.chosen > 0 {
		r.HitRate = s.oracle / s.chosen
	}
	if s.n > 0 {
		r.OracleChoice = float64(s.hits) / float64(s.n)
	}
	return r
}

// best returns the engine of cands with the least time on transfer k.
func best(cands []string, k int, t ...map[string][]float64) (string, float64) {
	name, least := "", math.Inf(1)
	for _, c := range cands {
		sum := 0.0
		for _, m := range t {
			sum += m[c][k]
		}
		if sum < least {
			name, least = c, sum
		}
	}
	return name, least
}

// steps calls fn for every transfer in replay order: each iteration's
// writes in order, then its reads in reverse.
func (r replayer) steps(fn func(op dict.Op, k int, size int64)) {
	k0 := 0
	for _, it := range r.iters {
		for i, j := range it {
			fn(dict.OpWrite, k0+i, r.sizes[j])
		}
		for i := len(it) - 1; i >= 0; i-- {
			fn(dict.OpRead, k0+i, r.sizes[it[i]])
		}
		k0 += len(it)
	}
}

func (r replayer) aware() ([]Result, []BucketResult, dict.DictFile, error) {
	cfg := dict.DictConfig{Write: r.cfg.Write, Read: r.cfg.Read, Explore: r.cfg.Explore, Refresh: r.cfg.Refresh, SaveInterval: -1}
	sep, err := dict.NewDictionaries(cfg)
	if err != nil {
		return nil, nil, dict.DictFile{}, err
	}
	wrd, _ := dict.NewDictionaries(cfg)
	ch, wrch := sep.Chooser(dict.UseSeparate), wrd.Chooser(dict.UseWriteRead)
	wr := wrd.Engines(dict.OpWrite, dict.WRDic)

	var sw, sr, swr score
	type bstat struct {
		score
		wins map[string]int
	}
	perBucket := map[[2]int]*bstat{}
	wrWrite := map[int]string{} // transfer -> engine that wrote it (WRDic)
	wrSpent := map[int]float64{}
	r.steps(func(op dict.Op, k int, size int64) {
		times, cands, s := r.tw, r.cfg.Write, &sw
		if op == dict.OpRead {
			times, cands, s = r.tr, r.cfg.Read, &sr
		}
		e := ch.Engine(op, size)
		oe, ot := best(cands, k, times)
		s.add(times[e][k], ot, e == oe)
		ch.Observe(op, size, e, time.Duration(times[e][k]*1e9))
		key := [2]int{int(op), dict.Bucket(size)}
		if perBucket[key] == nil {
			perBucket[key] = &bstat{wins: map[string]int{}}
		}
		perBucket[key].add(times[e][k], ot, e == oe)
		perBucket[key].wins[oe]++

		// The write+read dictionary: one engine should serve both.
		we := wrch.Engine(op, size)
		wrch.Observe(op, size, we, time.Duration(times[we][k]*1e9))
		if op == dict.OpWrite {
			wrWrite[k], wrSpent[k] = we, times[we][k]
			return
		}
		oe, ot = best(wr, k, r.tw, r.tr)
		swr.add(wrSpent[k]+times[we][k], ot, we == oe && wrWrite[k] == oe)
	})
	tot := score{chosen: sw.chosen + sr.chosen, oracle: sw.oracle + sr.oracle, n: sw.n + sr.n, hits: sw.hits + sr.hits}
	res := []Result{
		sw.result("aware", "write"), sr.result("aware", "read"),
		tot.result("aware", "write+read (separate)"), swr.result("aware", "write_read (WRDic)"),
	}
	var buckets []BucketResult
	for _, key := range slices.SortedFunc(maps.Keys(perBucket), func(a, b [2]int) int { return (a[0]-b[0])*1000 + a[1] - b[1] }) {
		b := perBucket[key]
		op := dict.Op(key[0])
		oracle, most := "", -1
		for n, c := range b.wins {
			if c > most || c == most && n < oracle {
				oracle, most = n, c
			}
		}
		res := b.result("", "")
		buckets = append(buckets, BucketResult{
			Direction: op.String(), Bucket: key[1], Size: dict.HumanSize(dict.BucketSize(key[1])), Transfers: b.n,
			Oracle: oracle, Chosen: sep.BestIn(dict.Table(key[0]), key[1]), HitRate: res.HitRate,
		})
	}
	return res, buckets, sep.Snapshot(), nil
}

// hindsight scores the fixed dictionary a clairvoyant would build: per
// bucket and direction, the engine with the least total time over the run
// (the paper's "Best" column: a dictionary of each size's best tool). It is
// the ceiling of any dictionary that keeps one engine per bucket.
func (r replayer) hindsight() []Result {
	total := map[[2]int]map[string]float64{}
	r.steps(func(op dict.Op, k int, size int64) {
		times, cands := r.tw, r.cfg.Write
		if op == dict.OpRead {
			times, cands = r.tr, r.cfg.Read
		}
		key := [2]int{int(op), dict.Bucket(size)}
		if total[key] == nil {
			total[key] = map[string]float64{}
		}
		for _, c := range cands {
			total[key][c] += times[c][k]
		}
	})
	var sw, sr score
	r.steps(func(op dict.Op, k int, size int64) {
		times, cands, s := r.tw, r.cfg.Write, &sw
		if op == dict.OpRead {
			times, cands, s = r.tr, r.cfg.Read, &sr
		}
		t := total[[2]int{int(op), dict.Bucket(size)}]
		e := slices.MinFunc(cands, func(a, b string) int { return cmp.Compare(t[a], t[b]) })
		oe, ot := best(cands, k, times)
		s.add(times[e][k], ot, e == oe)
	})
	return []Result{sw.result("hindsight", "write"), sr.result("hindsight", "read")}
}

// tools scores the specific-tool mode of every engine.
func (r replayer) tools() []Result {
	var out []Result
	all := slices.Clone(r.cfg.Write)
	for _, n := range r.cfg.Read {
		if !slices.Contains(all, n) {
			all = append(all, n)
		}
	}
	for _, n := range all {
		var sw, sr score
		r.steps(func(op dict.Op, k int, _ int64) {
			times, cands, s := r.tw, r.cfg.Write, &sw
			if op == dict.OpRead {
				times, cands, s = r.tr, r.cfg.Read, &sr
			}
			if !slices.Contains(cands, n) {
				return
			}
			oe, ot := best(cands, k, times)
			s.add(times[n][k], ot, n == oe)
		})
		if sw.n > 0 {
			out = append(out, sw.result("tool:"+n, "write"))
		}
		if sr.n > 0 {
			out = append(out, sr.result("tool:"+n, "read"))
		}
	}
	return out
}
