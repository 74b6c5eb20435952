package frontend

import (
	"fmt"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/loader"
)

// Get serves the requests at positions is (GetBatch: all of them or
// none) and keeps the delivered samples under a new ticket for Take or
// GiveBack. The caller reads the samples' positions, sources, labels and
// lengths and must not keep them past that ticket's Take.
func (l *Loader) Get(is []int) (ticket uint64, batch []loader.Sample, err error) {
	batch, err = l.GetBatch(is)
	if err != nil {
		return 0, nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.next++
	l.tickets[l.next] = batch
	return l.next, batch, nil
}

// ticket removes and returns the batch of a ticket.
func (l *Loader) ticket(t uint64) ([]loader.Sample, error) {
	l.mu.Lock()
	batch, ok := l.tickets[t]
	delete(l.tickets, t)
	l.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: loader: no batch of ticket %d (taken already?)", gds.ErrInvalid, t)
	}
	return batch, nil
}

// Take copies the n samples of a Get's ticket into the caller's memory,
// dst(k, size) for sample k of size bytes (used during the call only),
// drops the ticket and releases the samples. n must be the batch's
// length; the ticket is dropped even when the copy fails.
func (l *Loader) Take(ticket uint64, n int, dst func(k, size int) ([]byte, error)) error {
	batch, err := l.ticket(ticket)
	if err != nil {
		return err
	}
	if n != len(batch) {
		return fmt.Errorf("%w: loader: %d addresses for the %d samples of ticket %d", gds.ErrInvalid, n, len(batch), ticket)
	}
	for k, s := range batch {
		b, err := dst(k, len(s.Data))
		if err != nil {
			return fmt.Errorf("loader: sample %d of ticket %d: %w", k, ticket, err)
		}
		copy(b, s.Data)
	}
	l.Release(batch)
	return nil
}

// GiveBack gives a Get's batch back to the server, copying nothing
// (Return: the requests asked again get its samples), and drops the
// ticket.
func (l *Loader) GiveBack(ticket uint64) error {
	batch, err := l.ticket(ticket)
	if err != nil {
		return err
	}
	l.Return(batch)
	return nil
}
