package frontend

import (
	"fmt"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/loader/dist"
)

// DistListen makes the loader, its server opened with the options' rank
// and world, a node of a cluster (dist.NewNode with o) serving the other
// nodes over gRPC on addr ("host:port", port 0 picks one). It returns the
// address the node listens on. A loader joins one cluster.
func (l *Loader) DistListen(addr string, o dist.Options) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.node != nil {
		return "", fmt.Errorf("%w: loader: the server is a node of a cluster already", gds.ErrInvalid)
	}
	n, err := dist.NewNode(l.srv, o)
	if err != nil {
		return "", err
	}
	at, err := n.Listen(addr)
	if err != nil {
		_ = n.Close()
		return "", err
	}
	l.node = n
	return at, nil
}

// DistConnect connects the node to the others, at addrs (by rank),
// checking that each serves the same pack and layout (dist.Node.Connect).
func (l *Loader) DistConnect(addrs []string) error {
	n, err := l.needNode("dist connect")
	if err != nil {
		return err
	}
	return n.Connect(addrs)
}

// DistSequence gives the node the positions its sampler asks for in
// epoch, in order (dist.Node.SetSequence): owners prefetch along it.
func (l *Loader) DistSequence(epoch uint64, positions []int) error {
	n, err := l.needNode("dist sequence")
	if err != nil {
		return err
	}
	return n.SetSequence(epoch, positions)
}

// DistDrop gives the node's prefetched samples back to their owners
// (dist.Node.Drop): on every node before any takes its state.
func (l *Loader) DistDrop() error {
	n, err := l.needNode("dist drop")
	if err != nil {
		return err
	}
	return n.Drop()
}
