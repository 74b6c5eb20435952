package hooks

import "sync"

// queue is the store's work list: unbounded (a put never blocks on a full
// queue while holding the store's lock), with reads served before writes
// because a read is on the critical path of the backward pass while a write
// only frees memory sooner.
type queue struct {
	mu            sync.Mutex
	cond          sync.Cond
	reads, writes []func()
	closed        bool
}

func newQueue() *queue {
	q := &queue{}
	q.cond.L = &q.mu
	return q
}

// push adds a job. After close, the job runs on the caller's goroutine, so
// that a job pushed by a finishing job (a deferred prefetch) still runs.
func (q *queue) push(read bool, job func()) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		job()
		return
	}
	if read {
		q.reads = append(q.reads, job)
	} else {
		q.writes = append(q.writes, job)
	}
	q.mu.Unlock()
	q.cond.Signal()
}

// pop waits for a job; it returns false once the queue is closed and empty.
func (q *queue) pop() (func(), bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.reads) == 0 && len(q.writes) == 0 && !q.closed {
		q.cond.Wait()
	}
	var job func()
	switch {
	case len(q.reads) > 0:
		job, q.reads[0] = q.reads[0], nil
		q.reads = q.reads[1:]
	case len(q.writes) > 0:
		job, q.writes[0] = q.writes[0], nil
		q.writes = q.writes[1:]
	default:
		return nil, false
	}
	return job, true
}

// close lets workers finish the jobs queued and then stop.
func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Broadcast()
}
