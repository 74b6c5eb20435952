package loader

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// A pack's output directory, before Pack writes to it: what is there, and
// whether all of it is ours. The plan (pack.plan) is the first file a
// pack writes and the last one it would remove (it never does), so a
// directory with chunk files or an index but no plan was not written by
// Pack, and is refused.

// plan is pack.plan: which spec the pack in the directory is of.
type plan struct {
	Format    string `json:"format"`
	Version   int    `json:"version"`
	Spec      string `json:"spec_sha256"`
	Samples   int    `json:"samples"`
	Chunks    int    `json:"chunks"`
	ChunkSize int    `json:"chunk_size"`
	Seed      uint64 `json:"seed"`
}

// planFormat marks a plan as ours.
const planFormat = "pyfastensor pack plan"

// outDir is what a scan of an output directory found.
type outDir struct {
	path   string
	plan   *plan // nil: none
	index  bool
	chunks []int    // numbers of the chunk files present, ascending
	temps  []string // targets of our temporary files (base names)
}

// hasChunk reports whether chunk n's file is present.
func (d *outDir) hasChunk(n int) bool {
	_, ok := slices.BinarySearch(d.chunks, n)
	return ok
}

// scanOut lists out, which must exist, and refuses it (ErrNotOurs, naming
// the file) when it holds anything a pack does not write, or pack files
// without a plan of ours.
func scanOut(out string) (*outDir, error) {
	entries, err := os.ReadDir(out)
	if err != nil {
		return nil, fmt.Errorf("loader: pack: %w", gds.Classify(err))
	}
	d := &outDir{path: out}
	notOurs := func(name, why string) error {
		return fmt.Errorf("loader: pack: %w: %s in %s %s; choose an empty directory or remove it",
			ErrNotOurs, name, out, why)
	}
	var planSeen bool
	for _, e := range entries {
		name := e.Name()
		target := name
		if t, ok := transfer.TempTarget(name); ok {
			target = t
		}
		n, isChunk := chunkNumber(target)
		switch {
		case !e.Type().IsRegular():
			return nil, notOurs(name, "is not a regular file")
		case target != name && (isChunk || target == IndexName || target == PlanName):
			d.temps = append(d.temps, target)
		case isChunk:
			d.chunks = append(d.chunks, n)
		case name == IndexName:
			d.index = true
		case name == PlanName:
			planSeen = true
		default:
			return nil, notOurs(name, "is not a file of a pack")
		}
	}
	slices.Sort(d.chunks)
	if planSeen {
		p, err := readPlan(filepath.Join(out, PlanName))
		if err != nil {
			return nil, notOurs(PlanName, "is not a plan a pack wrote ("+err.Error()+")")
		}
		d.plan = p
	} else if d.index || len(d.chunks) > 0 || len(d.temps) > 0 {
		return nil, notOurs(fmt.Sprintf("pack files (%d chunks, index %v)", len(d.chunks), d.index), "but no "+PlanName+", which a pack writes first")
	}
	return d, nil
}

// readPlan reads and checks a plan file.
func readPlan(path string) (*plan, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var p plan
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	if p.Format != planFormat || p.Version < 1 || len(p.Spec) != 64 {
		return nil, fmt.Errorf("format %q version %d", p.Format, p.Version)
	}
	return &p, nil
}

// writePlan writes out's plan for a spec, durably (before any chunk).
func writePlan(out string, s *PackSpec, hash [32]byte, fsys transfer.FS) error {
	p := plan{Format: planFormat, Version: FormatVersion, Spec: hex.EncodeToString(hash[:]),
		Samples: len(s.Samples), Chunks: numChunks(len(s.Samples), s.ChunkSize), ChunkSize: s.ChunkSize, Seed: s.Seed}
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	_, _, err = transfer.WriteFile(filepath.Join(out, PlanName), int64(len(b)),
		[]transfer.Extent{{Data: b}}, true, fsys, transfer.Options{Chooser: transfer.Fixed("posix")})
	if err != nil {
		return fmt.Errorf("loader: pack: writing %s: %w", filepath.Join(out, PlanName), err)
	}
	return nil
}

// prepare readies a scanned directory for a pack of spec (hash): the
// index goes first (a pack being written has none, so it cannot verify);
// then, for another spec, every chunk file (restart) and a new plan;
// temporary files of writes that died go too. It reports whether this
// resumes a pack of the same spec and how many chunk files it removed.
func (d *outDir) prepare(s *PackSpec, hash [32]byte, fsys transfer.FS) (resumed bool, removed int, err error) {
	remove := func(name string) error {
		if err := fsys.Remove(filepath.Join(d.path, name)); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("loader: pack: removing %s: %w", filepath.Join(d.path, name), gds.Classify(err))
		}
		return nil
	}
	for _, t := range slices.Compact(slices.Sorted(slices.Values(d.temps))) {
		transfer.CleanStale(filepath.Join(d.path, t))
	}
	if d.index {
		if err := remove(IndexName); err != nil {
			return false, 0, err
		}
		if err := fsys.SyncDir(d.path); err != nil {
			return false, 0, fmt.Errorf("loader: pack: %w", gds.Classify(err))
		}
		d.index = false
	}
	want := hex.EncodeToString(hash[:])
	resumed = d.plan != nil && d.plan.Spec == want
	chunks := numChunks(len(s.Samples), s.ChunkSize)
	var keep []int
	for _, n := range d.chunks {
		if resumed && n < chunks {
			keep = append(keep, n)
			continue
		}
		if err := remove(ChunkName(n)); err != nil {
			return false, removed, err
		}
		removed++
	}
	d.chunks = keep
	if !resumed {
		if err := writePlan(d.path, s, hash, fsys); err != nil {
			return false, removed, err
		}
	}
	return resumed, removed, nil
}
