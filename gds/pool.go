package gds

import (
	"sync"
	"sync/atomic"
)

// Run calls fn(i) for i in [0, n) on up to workers goroutines and returns
// the error of the lowest-numbered task that failed. Tasks are claimed in
// order, so every task below the one whose error is returned has run to
// its end; after a failure, tasks not yet started are skipped.
//
// This is the one worker pool of the library: an engine's pieces of one
// large transfer (splitRun) and, through transfer.Run, every transfer,
// verification and save above the engines. A task's panic fails the call
// with an error wrapping ErrInternal (Recover, the one panic policy) and
// never takes the process down.
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

// safeTask runs one task under Recover.
func safeTask(fn func(int) error, i int) (err error) {
	defer Recover(&err)
	return fn(i)
}
