package loader

import (
	"runtime/debug"
	"sync"
)

// The Go runtime's soft memory limit follows the open loader servers'
// budgets. A server holds up to its budget in samples copied into Go
// memory, and with the collector's default pacing (GOGC=100) the heap
// grows to about twice what is live before a collection: a server of a
// 1 GB budget took 2 GB, and bench data's memory cgroup (budget + 1 GiB)
// killed it at 100,000 files. While servers are open the limit is their
// budgets plus an eighth plus limitSlack (gRPC, whatever else Go holds;
// chunk buffers of 2 MiB and more are mapped outside the heap), so the
// collector runs sooner as the heap nears it. The samples are byte slices
// the collector does not scan, so a collection near the limit costs
// little. At a quarter plus 256 MiB the reader's resident memory came
// within 40 MiB of that cgroup's limit (the Go heap at its limit, with
// torch, the workers' ring and the chunk buffers). A soft limit is never
// an error (the collector's CPU share is capped when it cannot keep under
// it); a lower limit the process had already (GOMEMLIMIT) is kept.

const limitSlack = 64 << 20

var memLimit struct {
	mu      sync.Mutex
	budgets int64
	before  int64 // the limit when the first server opened
}

// HoldBudget adds n bytes of budget (a server opened) or, negative, takes
// them away (closed), and sets the limit.
func HoldBudget(n int64) {
	memLimit.mu.Lock()
	defer memLimit.mu.Unlock()
	if memLimit.budgets == 0 {
		memLimit.before = debug.SetMemoryLimit(-1)
	}
	memLimit.budgets = max(memLimit.budgets+n, 0)
	if memLimit.budgets == 0 {
		debug.SetMemoryLimit(memLimit.before)
		return
	}
	debug.SetMemoryLimit(min(memLimit.before, memLimit.budgets+memLimit.budgets/8+limitSlack))
}
