package gds

// splitRun performs a transfer of n bytes as pieces of at most taskSize
// bytes on up to threads goroutines (Run). piece(lo, hi) moves bytes
// [lo, hi) of the transfer and returns how many it moved. A transfer
// smaller than two pieces runs on the caller's goroutine.
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
	done := make([]int, pieces)
	err := Run(pieces, threads, func(i int) error {
		lo := i * ts
		k, err := piece(lo, min(lo+ts, n))
		done[i] = k
		return err
	})
	if err == nil {
		return n, nil
	}
	moved := 0
	for i, k := range done {
		moved += k
		if k < min(ts, n-i*ts) {
			break
		}
	}
	return moved, err
}
