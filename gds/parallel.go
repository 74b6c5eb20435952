package gds

import (
	"sync"
	"sync/atomic"
)

// splitRun performs a transfer of n bytes as pieces of at most taskSize
// bytes on up to threads goroutines. piece(lo, hi) moves bytes [lo, hi) of
// the transfer and returns how many it moved. A transfer smaller than two
// pieces runs on the caller's goroutine.
//
// It returns the number of bytes moved by all pieces and the error of the
// lowest-addressed piece that failed. After an error, pieces not yet started
// are skipped.
func splitRun(n int, taskSize int64, threads int, piece func(lo, hi int) (int, error)) (int, error) {
	if int64(n) < 2*taskSize || threads <= 1 {
		return piece(0, n)
	}
	ts := int(taskSize)
	pieces := (n + ts - 1) / ts
	workers := min(threads, pieces)

	var (
		next    atomic.Int64
		done    atomic.Int64
		failed  atomic.Bool
		mu      sync.Mutex
		errAt   = n
		firstEr error
		wg      sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= pieces {
					return
				}
				lo := i * ts
				hi := min(lo+ts, n)
				k, err := piece(lo, hi)
				done.Add(int64(k))
				if err != nil {
					failed.Store(true)
					mu.Lock()
					if lo < errAt {
						errAt, firstEr = lo, err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return int(done.Load()), firstEr
}
