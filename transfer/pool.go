package transfer

import (
	"sync"
	"sync/atomic"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Run calls fn(i) for i in [0, n) on up to workers goroutines and returns
// the error of the lowest-numbered task that failed. After a failure, tasks
// not yet started are skipped. This is the one worker pool above the
// engines: checkpoint saves and loads, raw files, verification and the
// spill store's transfers all run their tasks through it.
//
// Panics follow gds.Recover, the one policy: a task's panic fails this
// call with an error wrapping gds.ErrInternal (with the stack) and never
// takes the process down or poisons the library.
func Run(n, workers int, fn func(i int) error) error {
	if n == 0 {
		return nil
	}
	workers = max(1, min(workers, n))
	var (
		next   atomic.Int64
		failed atomic.Bool
		mu     sync.Mutex
		errAt  = n
		first  error
		wg     sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := safeTask(fn, i); err != nil {
					failed.Store(true)
					mu.Lock()
					if i < errAt {
						errAt, first = i, err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// safeTask runs one task under gds.Recover.
func safeTask(fn func(int) error, i int) (err error) {
	defer gds.Recover(&err)
	return fn(i)
}

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
