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
// It returns n, nil when every piece succeeded; otherwise the error of the
// lowest-addressed piece that failed and the count of bytes moved without a
// gap from the start (every piece below the failed one completed, since
// pieces are claimed in order). After an error, pieces not yet started are
// skipped.
func splitRun(n int, taskSize int64, threads int, piece func(lo, hi int) (int, error)) (int, error) {
	if int64(n) < 2*taskSize || threads <= 1 {
		return piece(0, n)
	}
	ts := int(taskSize)
	pieces := (n + ts - 1) / ts
	workers := min(threads, pieces)

	var (
		next    atomic.Int64
		failed  atomic.Bool
		mu      sync.Mutex
		errAt   = n
		errDone int
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
				k, err := safePiece(piece, lo, hi)
				if err != nil {
					failed.Store(true)
					mu.Lock()
					if lo < errAt {
						errAt, errDone, firstEr = lo, k, err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if firstEr != nil {
		return errAt + errDone, firstEr
	}
	return n, nil
}

// safePiece runs piece and turns a panic into an error wrapping ErrInternal:
// a worker goroutine's panic would otherwise end the whole process, since
// the C boundary's recover only covers the calling goroutine.
func safePiece(piece func(lo, hi int) (int, error), lo, hi int) (n int, err error) {
	defer Recover(&err)
	return piece(lo, hi)
}
