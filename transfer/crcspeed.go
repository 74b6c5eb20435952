package transfer

import (
	"time"
)

// CRCSpeed measures Checksum on one goroutine, as the benchmarks print it
// beside the engines: bytes per second over a block of block bytes summed
// again and again for about d (block small enough for the CPU's cache:
// the speed of summing bytes just copied; large: the speed of a second
// pass over memory that left the cache). The block is filled first, so
// its pages are not faulted in while timed.
func CRCSpeed(block int, d time.Duration) float64 {
	b := make([]byte, max(block, 1))
	for i := range b {
		b[i] = byte(i * 131)
	}
	Checksum(b) // warm: the pages and the cache
	var n int64
	start := time.Now()
	for {
		Checksum(b)
		n += int64(len(b))
		if el := time.Since(start); el >= d {
			return float64(n) / el.Seconds()
		}
	}
}
