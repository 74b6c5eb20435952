// Package dist is the Brand loader across nodes (the paper's section
// 3.4): each node's loader.Server owns a disjoint share of the abstract
// chunks (loader.ServerOptions Rank and World: abstract chunk g is node
// g % World's); a Node serves requests for its own share from its server
// and sends the others, batched per owner, to their owner over gRPC. The
// owner answers with the samples its server delivers for them (GetBatch)
// and, opportunistically, with samples already in its memory for the
// requester's upcoming requests (loader.Server.Prefetch), which the
// requester keeps in its remote abstract memory, within a byte limit, and
// serves later requests of those slots from.
//
// Exactly once per epoch: every sample is delivered by its owner's server
// once, to a local request, a remote one or a prefetch; a prefetched
// sample is only sent for a slot that is free in the requester's remote
// memory, matched to a request of the requester's access sequence for
// that slot not yet issued (the first such in its window), so a later
// request of the requester consumes it. So when the nodes' requests
// partition a permutation of the pack's positions (each node asking for
// its sampler's share), the union of what the nodes deliver is every
// sample once. The order depends on how the nodes' requests interleave at
// each owner, not on (seed, epoch, request sequence) alone as on one node.
//
// Security: a node listens on the address it is given (the process
// group's interface, not every interface) and refuses any call that does
// not carry the job's token (a secret shared through the job's store) in
// its metadata. The transport is not encrypted: the token keeps other
// jobs and stray clients out, not an eavesdropper on the job's network.
package dist

import (
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/loader"
)

// TokenKey is the metadata key every call carries the job's token in.
const TokenKey = "pyfastensor-token"

// DefaultWindow is how many of the requester's upcoming requests an owner
// may prefetch for (Options.Window). Not tuned: the paper does not give
// its window; it bounds the scan per miss, while the remote memory limit
// bounds what is held.
const DefaultWindow = 256

// DefaultTimeout bounds one call to another node (Options.Timeout): a
// node that does not answer in that time counts as failed.
const DefaultTimeout = 120 * time.Second

// maxMessage bounds a message between nodes: a batch's samples plus the
// prefetched ones (at most the remote memory limit).
const maxMessage = 1 << 30

// flowWindow is each HTTP/2 stream's and connection's flow-control
// window: an answer of a batch and its prefetch (hundreds of KiB) then
// crosses without waiting for window updates (gRPC's default starts at
// 64 KiB and grows with its estimate of the link).
const flowWindow = 16 << 20

// ErrNodeFailed: another node did not answer (killed, unreachable, timed
// out) or refused the call. The message names the node and its address.
var ErrNodeFailed = gds.Named(gds.ErrUnavailable, "a node of the loader cluster failed")

// Options configure a Node.
type Options struct {
	Rank  int `json:"rank"`
	World int `json:"world"`
	// Token is the job's secret: every call carries it, and a node
	// refuses calls without it.
	Token string `json:"token"`
	// RemoteBytes is the remote abstract memory's limit: the bytes of
	// prefetched samples this node holds at most.
	RemoteBytes int64 `json:"remote_bytes"`
	// Window is how many upcoming requests of the access sequence a miss
	// offers its owner to prefetch for; 0 means DefaultWindow.
	Window int `json:"window"`
	// NoPrefetch sends the requests only (the paper's
	// Brand-no-prefetching), for comparison.
	NoPrefetch bool `json:"no_prefetch"`
	// Timeout bounds each call to another node; 0 means DefaultTimeout.
	Timeout time.Duration `json:"timeout"`
}

// Stats count a node's distributed work in the current epoch (SetEpoch
// and Restore zero them but the peak).
type Stats struct {
	Rank  int `json:"rank"`
	World int `json:"world"`
	// Requests for positions this node owns, served by its server.
	LocalRequests int64 `json:"local_requests"`
	// Requests for positions other nodes own: served from the remote
	// memory (hits, prefetched earlier) or from the owner (misses).
	RemoteHits   int64 `json:"remote_hits"`
	RemoteMisses int64 `json:"remote_misses"`
	// RemoteRequests are the Fetch calls sent (a batch's misses, one per
	// owner).
	RemoteRequests int64 `json:"remote_requests"`
	// Prefetched samples received, and their bytes.
	Prefetched      int64 `json:"prefetched"`
	PrefetchedBytes int64 `json:"prefetched_bytes"`
	// As owner: samples delivered to other nodes' misses and prefetched
	// for them.
	ServedRemote int64 `json:"served_remote"`
	PrefetchSent int64 `json:"prefetch_sent"`
	// The remote memory now, at most, and its limit.
	RemoteHeldBytes int64 `json:"remote_held_bytes"`
	RemotePeakBytes int64 `json:"remote_peak_bytes"`
	RemoteLimit     int64 `json:"remote_limit"`
}

// State is a node's state: its server's (the owner side), with the
// position in its access sequence. The remote memory is not in it: Drop
// gives it back to the owners first (and every node's Drop must come
// before any node's State).
type State struct {
	loader.State
	Rank  int `json:"rank"`
	World int `json:"world"`
	// Issued is how many requests of the access sequence (SetSequence)
	// were issued, a prefix when they came in order: where a sampler
	// resumes.
	Issued int `json:"issued"`
}
