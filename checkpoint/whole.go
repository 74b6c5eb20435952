package checkpoint

import (
	"os"
	"path/filepath"

	"github.com/pyfastensor/pyfastensor/gds"
)

// A cold load of one of our archives reads the file whole, in large
// O_DIRECT requests, into one page-aligned memory area, then parses and
// verifies it from memory (OpenArchiveMemory, Verify): one sequential
// stream at the disk's bandwidth, instead of a parse that waits for the
// disk at each run of small records and reads the records one by one.
// The Python side then hands each large record's pages to its tensor.

// WholePlan describes a file for the choice of that path.
type WholePlan struct {
	// Size is the file's length in bytes.
	Size int64 `json:"size"`
	// Resident is the share of the file in the page cache (0 to 1).
	Resident float64 `json:"resident"`
	// Direct is whether O_DIRECT works in the file's directory (the probe
	// DefaultChooser uses).
	Direct bool `json:"direct"`
	// Ours is whether the file ends with our writer's comment: its storage
	// records then start on page boundaries (DataAlign), and their pages
	// can be handed to tensors whole.
	Ours bool `json:"ours"`
	// Records is the number of records our zip64 end record announces (0
	// when the file is not ours or its end is damaged; opening it says how).
	Records int64 `json:"records"`
}

// PlanWhole describes the file at path for a whole-file cold read.
func PlanWhole(path string) (WholePlan, error) {
	st, err := os.Stat(path)
	if err != nil {
		return WholePlan{}, classify(err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return WholePlan{}, err
	}
	c, ok := DefaultChooser(filepath.Dir(abs)).(*ThresholdChooser)
	plan := WholePlan{Size: st.Size(), Direct: ok && c.Direct}
	if res, err := gds.Resident(path, []int64{0}, []int64{st.Size()}); err == nil && len(res) == 1 {
		plan.Resident = res[0]
	}
	// Our files end with the zip64 end record, its locator, the end record
	// and our comment (endRecords).
	if n := int64(endTotalLen + cdCommentLen); st.Size() >= n {
		f, err := os.Open(path)
		if err != nil {
			return WholePlan{}, classify(err)
		}
		defer f.Close()
		tail := make([]byte, n)
		if _, err := f.ReadAt(tail, st.Size()-n); err == nil {
			plan.Ours = oursComment(tail[endTotalLen:])
			if plan.Ours && le.Uint32(tail) == sigEnd64 {
				plan.Records = int64(min(le.Uint64(tail[32:]), uint64(st.Size())))
			}
		}
	}
	return plan, nil
}
