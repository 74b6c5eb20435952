package frontend

import (
	"encoding/json"
	"fmt"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/loader"
	"github.com/pyfastensor/pyfastensor/loader/dist"
)

// State is the loader's state, JSON, for Restore: a server's
// (loader.State), or a node's of a cluster (dist.State). Take it between
// batches.
func (l *Loader) State() (json.RawMessage, error) {
	var (
		st  any
		err error
	)
	if n := l.distNode(); n != nil {
		st, err = n.State()
	} else {
		st, err = l.srv.State()
	}
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("loader: state: %w", err)
	}
	return b, nil
}

// Restore puts the loader in a state State wrote (JSON): a server's
// (loader.Server.Restore) of the same pack and layout, or, for a node of
// a cluster, a node's (dist.Node.Restore). A state that does not parse
// is gds.ErrInvalid.
func (l *Loader) Restore(state []byte) error {
	if n := l.distNode(); n != nil {
		var st dist.State
		if err := json.Unmarshal(state, &st); err != nil {
			return fmt.Errorf("%w: loader: a node's state: %v", gds.ErrInvalid, err)
		}
		return n.Restore(st)
	}
	var st loader.State
	if err := json.Unmarshal(state, &st); err != nil {
		return fmt.Errorf("%w: loader: a server's state: %v", gds.ErrInvalid, err)
	}
	return l.srv.Restore(st)
}

// Stats are the server's counters and, for a node of a cluster, the
// node's.
type Stats struct {
	loader.Stats
	Dist *dist.Stats `json:"dist,omitempty"` // a node's
}

// Stats is the loader's counters.
func (l *Loader) Stats() Stats {
	st := Stats{Stats: l.srv.Stats()}
	if n := l.distNode(); n != nil {
		d := n.Stats()
		st.Dist = &d
	}
	return st
}
