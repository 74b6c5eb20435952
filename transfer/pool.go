package transfer

import "github.com/pyfastensor/pyfastensor/gds"

// Run calls fn(i) for i in [0, n) on up to workers goroutines and returns
// the error of the lowest-numbered task that failed: the library's one
// worker pool (gds.Run, which the engines' own pieces use too), with its
// one panic policy (a task's panic fails this call with an error wrapping
// gds.ErrInternal, and never takes the process down or poisons the
// library). Checkpoint saves and loads, raw files, verification and the
// spill store's transfers all run their tasks through it.
func Run(n, workers int, fn func(i int) error) error { return gds.Run(n, workers, fn) }

// Piece is one task's share of an extent: bytes [Lo, Hi) of extent Ext.
type Piece struct {
	Ext    int
	Index  int // piece number within the extent
	Lo, Hi int64
}

// Split cuts an extent of size bytes into pieces of at most ps bytes.
func Split(ext int, size, ps int64) []Piece {
	var out []Piece
	for lo, i := int64(0), 0; lo < size; lo, i = lo+ps, i+1 {
		out = append(out, Piece{Ext: ext, Index: i, Lo: lo, Hi: min(lo+ps, size)})
	}
	return out
}

// PieceSize returns the largest transfer one task moves: the engines' task
// size. Larger extents are split so that their pieces (and their CRC-32s)
// run on several goroutines; a piece never exceeds one engine task, so the
// engine moves it in one go (and one bounce buffer holds it).
func PieceSize(o gds.Options) int64 {
	if o.TaskSize > 0 {
		return o.TaskSize
	}
	return gds.DefaultTaskSize
}
