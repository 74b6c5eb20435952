package dict

import (
	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"

	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/cpuid/v2"
	"golang.org/x/sys/unix"
)

// Persistence of the adaptive dictionaries: one JSON file per machine and
// filesystem, in the user cache directory (the Python layer resolves it),
// written atomically, read tolerantly.

// DictSchema is the version of the JSON layout written by Save. A file of
// another version is not read.
const DictSchema = 1

// MachineKey identifies the machine and filesystem a dictionary was measured
// on. The file name hashes Host, CPU, gds.FSType, Source and Mount: the mount
// source (the block device path, or host:/export for NFS) stays the same
// across reboots where device numbers may not, and the mount point tells
// apart virtual filesystems whose source is only a name ("tmpfs",
// "overlay"). Device (major:minor) is recorded for the reader only.
type MachineKey struct {
	Host   string `json:"host"`
	CPU    string `json:"cpu"`
	FSType string `json:"fs_type"`
	Source string `json:"source"`
	Mount  string `json:"mount"`
	Device string `json:"device"`
}

// MachineKeyFor returns the key of this machine and the filesystem that
// holds dir. Fields it cannot learn are left empty.
func MachineKeyFor(dir string) (MachineKey, error) {
	k := MachineKey{CPU: cpuid.CPU.BrandName}
	k.Host, _ = os.Hostname()
	fsType, err := gds.FSType(dir)
	if err != nil {
		return k, err
	}
	k.FSType = fsType
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return k, fmt.Errorf("stat %s: %w", dir, err)
	}
	k.Device = fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	abs, err := filepath.Abs(dir)
	if err == nil {
		if r, err := filepath.EvalSymlinks(abs); err == nil {
			abs = r
		}
		k.Mount, k.Source = mountOf(abs, k.Device)
	}
	return k, nil
}

// mountOf finds, in /proc/self/mountinfo, the mount of device dev whose
// mount point is the longest prefix of path, and returns its mount point
// and source.
func mountOf(path, dev string) (mount, source string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options... - fstype source superoptions
		left, right, ok := strings.Cut(sc.Text(), " - ")
		lf, rf := strings.Fields(left), strings.Fields(right)
		if !ok || len(lf) < 5 || len(rf) < 2 || lf[2] != dev {
			continue
		}
		mp := unescapeMount(lf[4])
		if (path == mp || mp == "/" || strings.HasPrefix(path, mp+"/")) && len(mp) >= len(mount) {
			mount, source = mp, rf[1]
		}
	}
	return mount, source
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// FileName is the dictionary file's name for this key:
// dict-<host>-<fs type>-<12 hex digits of the key's hash>.json.
func (k MachineKey) FileName() string {
	h := sha256.Sum256([]byte(strings.Join([]string{k.Host, k.CPU, k.FSType, k.Source, k.Mount}, "\x00")))
	clean := func(s string) string {
		s = strings.Map(func(r rune) rune {
			if r < 128 && (r == '-' || r == '.' || r == '_' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
				return r
			}
			return '_'
		}, s)
		return s[:min(len(s), 40)]
	}
	return fmt.Sprintf("dict-%s-%s-%s.json", clean(k.Host), clean(k.FSType), hex.EncodeToString(h[:6]))
}

// DictPath returns the dictionary file for the filesystem holding dir,
// inside cacheDir, with the key it was named after.
func DictPath(cacheDir, dir string) (string, MachineKey, error) {
	k, err := MachineKeyFor(dir)
	if err != nil {
		return "", k, err
	}
	return filepath.Join(cacheDir, k.FileName()), k, nil
}

// enginePreference orders candidates: posix first, as the engine that
// always works is the fallback.
var enginePreference = []string{"posix", "direct", "uring", "mmap", "cufile"}

// Candidates lists the engines that can write and read files in dir on this
// machine, in order of preference, and why each other engine is left out:
// unavailable engines; direct and uring where O_DIRECT does not work (they
// would fall back to posix); mmap for writes (it only reads); cufile where
// cuFile does not move bytes on dir's filesystem (gds.ProbeCuFileDir:
// library, driver, then a write and read through cuFile).
func Candidates(dir string, opts gds.Options) (write, read []string, excluded map[string]string) {
	excluded = map[string]string{}
	names := gds.Names()
	sort.SliceStable(names, func(i, j int) bool { return prefIndex(names[i]) < prefIndex(names[j]) })
	var direct *transfer.DirProbe
	for _, n := range names {
		if _, err := gds.New(n, opts); err != nil {
			excluded[n] = err.Error()
			continue
		}
		if n == "cufile" {
			if v := gds.ProbeCuFileDir(opts.CuFileLibrary, dir); !v.Available {
				excluded[n] = fmt.Sprintf("cuFile does not work on %s: %s", dir, v.Reason)
				continue
			}
		}
		if n == "direct" || n == "uring" {
			if direct == nil {
				di := transfer.Probe(dir)
				direct = &di
			}
			if !direct.Direct {
				excluded[n] = fmt.Sprintf("O_DIRECT does not work on %s (%s): %s would fall back to posix", dir, direct.FSType, n)
				continue
			}
		}
		if n != "mmap" {
			write = append(write, n)
		}
		read = append(read, n)
	}
	return write, read, excluded
}

func prefIndex(name string) int {
	if i := slices.Index(enginePreference, name); i >= 0 {
		return i
	}
	return len(enginePreference)
}

// DictFile is the JSON layout of a dictionary file (schema DictSchema).
// Compact: a dozen buckets of three dictionaries take a few KB.
type DictFile struct {
	Schema    int          `json:"schema"`
	Key       MachineKey   `json:"key"`
	Updated   string       `json:"updated,omitempty"`
	Settings  DictSettings `json:"settings"`
	Write     []DictEntry  `json:"write"`
	Read      []DictEntry  `json:"read"`
	WriteRead []DictEntry  `json:"write_read"`
}

// DictSettings records how a file's dictionaries were built.
type DictSettings struct {
	Mode    string   `json:"mode"`
	Explore int      `json:"explore"`
	Refresh int      `json:"refresh"`
	Alpha   float64  `json:"alpha"`
	Write   []string `json:"write_engines"`
	Read    []string `json:"read_engines"`
}

// DictEntry is one bucket of one dictionary. Size is 2^Bucket; a
// hand-written file may give Size alone, and Best alone (a specific
// dictionary that only names the engine per size).
type DictEntry struct {
	Bucket  int                   `json:"bucket"`
	Size    int64                 `json:"size"`
	Engines map[string]EngineStat `json:"engines,omitempty"`
	Best    string                `json:"best,omitempty"`
}

// Snapshot returns the dictionaries in their file layout.
func (d *Dictionaries) Snapshot() DictFile {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.snapshotLocked()
}

func (d *Dictionaries) snapshotLocked() DictFile {
	c := d.cfg
	doc := DictFile{
		Schema:   DictSchema,
		Key:      c.Key,
		Updated:  time.Now().UTC().Format(time.RFC3339),
		Settings: DictSettings{Mode: c.Mode.String(), Explore: c.Explore, Refresh: c.Refresh, Alpha: c.Alpha, Write: c.Write, Read: c.Read},
	}
	dump := func(t Table) []DictEntry {
		out := []DictEntry{}
		for _, b := range slices.Sorted(maps.Keys(d.tables[t])) {
			e := d.tables[t][b]
			if len(e.engines) == 0 && e.best == "" {
				continue // explored, never observed
			}
			de := DictEntry{Bucket: b, Size: BucketSize(b), Best: e.best, Engines: map[string]EngineStat{}}
			for n, s := range e.engines {
				// Four significant digits: measurement noise is larger.
				s.Seconds, _ = strconv.ParseFloat(strconv.FormatFloat(s.Seconds, 'g', 4, 64), 64)
				de.Engines[n] = s
			}
			out = append(out, de)
		}
		return out
	}
	doc.Write, doc.Read, doc.WriteRead = dump(WDic), dump(RDic), dump(WRDic)
	return doc
}

// Save writes the dictionaries to Path atomically, with transfer's commit
// protocol through cfg.FS: a temporary file in the same directory, fsync,
// rename over Path, fsync of the directory. Only
// ModeAware saves (the other modes never change what they loaded); without
// a Path Save does nothing.
func (d *Dictionaries) Save() error {
	if d.cfg.Mode != ModeAware || d.cfg.Path == "" {
		return nil
	}
	d.saveMu.Lock()
	defer d.saveMu.Unlock()
	d.mu.Lock()
	doc := d.snapshotLocked()
	d.dirty = false
	d.lastSave = time.Now()
	d.mu.Unlock()
	data, err := json.Marshal(doc)
	if err == nil {
		err = writeFile(d.cfg.Path, append(data, '\n'), d.cfg.FS)
	}
	if err != nil {
		d.mu.Lock()
		d.dirty = true
		d.mu.Unlock()
		return fmt.Errorf("saving dictionaries to %s: %w", d.cfg.Path, err)
	}
	return nil
}

// writeFile replaces path with data through transfer's commit protocol
// (transfer/commit.go: a temporary file in the same directory, reserved,
// fsynced, renamed over path, the directory fsynced), so that a crash
// leaves the old file or the new one, never a torn one, and the crash and
// fault tests of that protocol see it; fsys nil is transfer's default FS.
func writeFile(path string, data []byte, fsys transfer.FS) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	_, _, err := transfer.WriteFile(path, int64(len(data)), []transfer.Extent{{Data: data}}, true, fsys,
		transfer.Options{Chooser: transfer.Fixed("posix")})
	return err
}

// OpenDictionaries returns dictionaries loaded from cfg.Path.
//
// ModeAware is tolerant: a missing file gives empty dictionaries; an
// unreadable, corrupt or other-schema file gives empty dictionaries and a
// warning (the file is replaced at the next save). ModeSpecificDict is
// strict: the file is what the user asked for, so a missing or corrupt file
// is an error (wrapping fs.ErrNotExist or gds.ErrInvalid). ModeSpecificTool reads
// nothing. In every mode, entries that cannot be used (an engine this build
// does not know, a bad bucket or figure) are dropped with a warning; see
// Warnings.
func OpenDictionaries(cfg DictConfig) (*Dictionaries, error) {
	d, err := NewDictionaries(cfg)
	if err != nil || d.cfg.Mode == ModeSpecificTool {
		return d, err
	}
	strict := d.cfg.Mode == ModeSpecificDict
	if d.cfg.Path == "" {
		if strict {
			return nil, fmt.Errorf("%w: specific-dictionary mode needs the path of a dictionary file", gds.ErrInvalid)
		}
		return d, nil
	}
	data, err := os.ReadFile(d.cfg.Path)
	if errors.Is(err, fs.ErrNotExist) && !strict {
		return d, nil
	}
	var doc DictFile
	if err == nil {
		doc, err = ParseDictFile(data)
	}
	if err != nil {
		if strict {
			return nil, fmt.Errorf("%w: dictionary file %s: %w", gds.ErrInvalid, d.cfg.Path, err)
		}
		d.warnings = append(d.warnings, fmt.Sprintf("ignoring dictionary file %s (%v); starting with empty dictionaries, which replace it at the next save", d.cfg.Path, err))
		return d, nil
	}
	if !strict && d.cfg.Key != (MachineKey{}) && doc.Key != d.cfg.Key {
		d.warnings = append(d.warnings, fmt.Sprintf("dictionary file %s was measured on %s (%s on %s); this is %s (%s on %s): its figures are refreshed as transfers run",
			d.cfg.Path, doc.Key.Host, doc.Key.FSType, doc.Key.Source, d.cfg.Key.Host, d.cfg.Key.FSType, d.cfg.Key.Source))
	}
	d.install(doc)
	return d, nil
}

// ReadDictFile reads a dictionary file for display, as ModeAware would:
// a corrupt or other-schema file gives an empty document and a warning, and
// unusable entries are dropped with a warning. The key, settings and time
// are the file's. A missing file is an error wrapping fs.ErrNotExist.
func ReadDictFile(path string) (DictFile, []string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return DictFile{}, nil, err
	}
	doc, err := ParseDictFile(data)
	if err != nil {
		return DictFile{Schema: DictSchema}, []string{fmt.Sprintf("ignoring dictionary file %s: %v", path, err)}, nil
	}
	names := gds.Names()
	d, err := NewDictionaries(DictConfig{Write: names, Read: names})
	if err != nil {
		return DictFile{}, nil, err
	}
	d.install(doc)
	out := d.Snapshot()
	out.Key, out.Settings, out.Updated = doc.Key, doc.Settings, doc.Updated
	return out, d.Warnings(), nil
}

// ParseDictFile decodes a dictionary file and checks its schema version.
func ParseDictFile(data []byte) (DictFile, error) {
	var doc DictFile
	if err := json.Unmarshal(data, &doc); err != nil {
		return DictFile{}, fmt.Errorf("not valid JSON: %w", err)
	}
	if doc.Schema != DictSchema {
		return DictFile{}, fmt.Errorf("schema version %d, this library reads %d", doc.Schema, DictSchema)
	}
	return doc, nil
}

// install copies a file's entries into the tables, dropping with a warning
// what cannot be used.
func (d *Dictionaries) install(doc DictFile) {
	known := gds.Names()
	for t, entries := range [][]DictEntry{doc.Write, doc.Read, doc.WriteRead} {
		tab := Table(t)
		for _, de := range entries {
			b := de.Bucket
			if b == 0 && de.Size > 0 {
				b = Bucket(de.Size)
			}
			if b < MinBucket || b > MaxBucket {
				d.warnings = append(d.warnings, fmt.Sprintf("%s entry with bucket %d (size %d) ignored: buckets run from %d to %d", tab, de.Bucket, de.Size, MinBucket, MaxBucket))
				continue
			}
			where := fmt.Sprintf("%s bucket %s", tab, HumanSize(BucketSize(b)))
			e := newEntry()
			for name, s := range de.Engines {
				switch {
				case !slices.Contains(known, name):
					d.warnings = append(d.warnings, fmt.Sprintf("unknown engine %q in %s ignored (this library knows %s)", name, where, strings.Join(known, ", ")))
				case s.Samples <= 0 || s.Seconds < 0 || math.IsNaN(s.Seconds) || math.IsInf(s.Seconds, 0):
					d.warnings = append(d.warnings, fmt.Sprintf("engine %q in %s ignored: bad figure (%g s, %d samples)", name, where, s.Seconds, s.Samples))
				default:
					e.engines[name] = s
				}
			}
			switch {
			case de.Best == "":
			case !slices.Contains(known, de.Best):
				d.warnings = append(d.warnings, fmt.Sprintf("unknown best engine %q in %s ignored", de.Best, where))
			default:
				e.best = de.Best
			}
			if e.best == "" {
				e.best, _ = e.bestOf(slices.Sorted(maps.Keys(e.engines)))
			}
			if len(e.engines) == 0 && e.best == "" {
				continue
			}
			if _, dup := d.tables[tab][b]; dup {
				d.warnings = append(d.warnings, fmt.Sprintf("%s appears twice; the later entry is used", where))
			}
			d.tables[tab][b] = e
		}
	}
	// A file with write and read figures but no write+read entry for a
	// bucket (written by hand, or by an older version) gets it derived,
	// as observations would.
	for b := range d.tables[WDic] {
		if _, ok := d.tables[WRDic][b]; !ok {
			d.deriveWR(b)
		}
	}
}

// BestIn is the best engine recorded in table t for bucket b, or "" before
// the bucket has one.
func (d *Dictionaries) BestIn(t Table, b int) string { return d.bestIn(t, b) }

// bestIn is the best engine recorded in table t for bucket b, or "".
func (d *Dictionaries) bestIn(t Table, b int) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e := d.tables[t][b]; e != nil {
		return e.best
	}
	return ""
}

// Close stops background saving and saves changed dictionaries (ModeAware
// with a Path). It returns the save's error, or an earlier background
// save's.
func (d *Dictionaries) Close() error {
	d.bg.Wait()
	d.mu.Lock()
	dirty, bgErr := d.dirty, d.saveErr
	d.mu.Unlock()
	if dirty {
		return d.Save()
	}
	return bgErr
}

// HumanSize formats a byte count in binary units: "4K", "1.5M", "64M".
func HumanSize(n int64) string {
	units := []string{"", "K", "M", "G", "T", "P", "E"}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if v == math.Trunc(v) {
		return fmt.Sprintf("%d%s", int64(v), units[i])
	}
	return fmt.Sprintf("%.1f%s", v, units[i])
}
