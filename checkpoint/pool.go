package checkpoint

import (
	"sync"
	"sync/atomic"
)

// DefaultWorkers is the number of transfers in flight in a save or load.
// Several requests queued at the device keep it busy even on a two-core
// machine, since the goroutines mostly wait on I/O.
const DefaultWorkers = 8

// pieceSize is the largest transfer one task moves; larger records are
// split so that their pieces (and their CRC-32s) run on several goroutines.
const pieceSize = 16 << 20

// runTasks calls fn(i) for i in [0, n) on up to workers goroutines and
// returns the error of the lowest-numbered task that failed. After a
// failure, tasks not yet started are skipped.
func runTasks(n, workers int, fn func(i int) error) error {
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
				if err := fn(i); err != nil {
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

// piece is one task's share of a record: bytes [lo, hi) of record rec.
type piece struct {
	rec    int
	index  int // piece number within the record
	lo, hi int64
}

// splitPieces cuts a record of size bytes into pieces of at most pieceSize.
func splitPieces(rec int, size int64) []piece {
	var out []piece
	for lo, i := int64(0), 0; lo < size; lo, i = lo+pieceSize, i+1 {
		out = append(out, piece{rec: rec, index: i, lo: lo, hi: min(lo+pieceSize, size)})
	}
	return out
}

func piecesOf(size int64) int { return int((size + pieceSize - 1) / pieceSize) }
