package loader

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pyfastensor/pyfastensor/gds"
)

// The local protocol: one server per node, its clients the other
// processes of the node (DataLoader workers), which never load the Go
// runtime. A client connects to a Unix stream socket and sends requests,
// one at a time, each answered before the next:
//
//	frame    = u32 length of what follows, then the body (little-endian)
//	request  = u32 op, u32 n, u64 arg, payload
//	response = i32 status, u32 n, u64 ticket, payload
//
//	LocalHello   ->  payload: LocalHelloInfo, JSON
//	LocalGet     n positions (i64 each)  ->  ticket, n × LocalMetaFields i64,
//	             u64 the epoch the batch was delivered in
//	             arg: flags, LocalGetInTurn (then bits 16..31 the worker,
//	             32..47 the loader's workers, and the payload ends with a
//	             u64: milliseconds to wait for the turn; the answer adds a
//	             u64, the batch's index in turn) and LocalGetState (the
//	             answer ends with the server's state after the batch, JSON)
//	LocalTake    arg ticket, n its samples, payload u64 offset, u64 size,
//	             one file descriptor (SCM_RIGHTS)  ->  nothing
//	LocalReturn  arg ticket  ->  nothing
//	LocalRestore arg milliseconds to wait, payload: a WorkerPart, JSON
//	             ->  nothing, once every worker's part came
//
// Get serves a batch (Server.GetBatch: the samples are delivered by it),
// in the loader's round robin when in turn (Server.GetBatchInTurn), and
// keeps its bytes under a ticket. Take writes them, back to back in
// request order, into the client's shared memory (the file descriptor,
// mapped here for the copy and kept mapped for the client's next takes:
// one copy per byte, from the server's memory into the memory the
// client's tensors own, and none through the socket) from offset, and
// drops the ticket. Return gives the samples back
// (Server.Return). A connection that closes holding tickets, a client
// that died, gives their samples back, so a killed worker loses no sample
// and duplicates none. Restore is a DataLoader worker resuming from its
// part of a mid-epoch state (WorkerPart, state.go): the endpoint collects
// the parts of the loader's workers and, once all came, restores the
// state they make (Server.RestoreParts) and answers each of them (restoreParts). A
// non-zero status is the caller's status code
// (LocalOptions.Status) with the error's message as payload.
//
// Connections are accepted from processes of the server's user only
// (SO_PEERCRED): an abstract socket has no file permissions.

// LocalProtocol is the version of the protocol, checked by LocalHello.
const LocalProtocol = 3

// The requests' ops.
const (
	LocalHello  = 1
	LocalGet    = 2
	LocalTake   = 3
	LocalReturn = 4
	// LocalRestore: protocol 2.
	LocalRestore = 5
)

// LocalGet's flags (its arg): protocol 3.
const (
	LocalGetInTurn = 1
	LocalGetState  = 2
)

// LocalTurnWait is how long a LocalGet in turn with no wait of its own
// (0) waits for the batches before it.
const LocalTurnWait = 5 * time.Minute

// LocalRestoreWait is how long a LocalRestore with no wait of its own
// (arg 0) waits for the other workers' parts.
const LocalRestoreWait = 30 * time.Second

// LocalMetaFields is the i64s of a sample's metadata in a LocalGet
// answer: position, source, label, length.
const LocalMetaFields = 4

// localMaxFrame bounds a request's frame: a batch of a million requests
// (8 bytes each), or a worker's part of a state for a pack of n samples
// (two bitmaps of n/8 bytes in base64: n/3 bytes, in JSON with its head),
// whichever is larger.
func localMaxFrame(samples int) uint32 {
	return 16 + uint32(max(8<<20, samples/2+1<<20))
}

// LocalHelloInfo is the answer to LocalHello.
type LocalHelloInfo struct {
	Protocol int    `json:"protocol"`
	Samples  int    `json:"samples"`
	Epoch    uint64 `json:"epoch"`
	PID      int    `json:"pid"`
	// Part is a worker's part of the server's state now with no position
	// delivered, for a worker to fill in: nil when the backend restores
	// no parts (it is not a Resumable).
	Part *WorkerPart `json:"part,omitempty"`
}

// LocalOptions configure a Local endpoint.
type LocalOptions struct {
	// Status maps an error to the status code a client sees (the C
	// ABI's, so both paths raise the same exception); nil sends 1.
	Status func(error) int32
}

// Backend is what a Local endpoint serves: a Server, or a node of a
// cluster of servers (loader/dist) with the same semantics.
type Backend interface {
	Len() int
	Epoch() uint64
	GetBatch(is []int) ([]Sample, error)
	Return(samples []Sample)
	Release(samples []Sample)
}

// TurnBackend is a Backend that serves DataLoader workers' batches in the
// loader's round robin (a Server: GetBatchInTurn).
type TurnBackend interface {
	GetBatchInTurn(t Turn, is []int, state bool, wait time.Duration, gone func() <-chan struct{}) (InTurn, error)
}

// Resumable is a Backend that DataLoader workers can resume from their
// parts of a state (a Server).
type Resumable interface {
	Head() StateHead // what the backend's state now is of
	RestoreParts(parts []WorkerPart) error
}

// ErrIncomplete: a restore from DataLoader workers' parts that did not get
// every worker's in time.
var ErrIncomplete = gds.Named(gds.ErrUnavailable, "DataLoader workers' parts of a state missing")

// Local is a Server's endpoint for the processes of its node.
type Local struct {
	srv    Backend
	ln     *net.UnixListener
	status func(error) int32
	// maxFrame bounds a request's frame (localMaxFrame of the pack).
	maxFrame uint32

	mu     sync.Mutex
	closed bool
	conns  map[*net.UnixConn]struct{}
	wg     sync.WaitGroup

	rmu   sync.Mutex
	round *partsRound // the parts of a restore being collected, or nil
}

// partsRound is one restore's parts as they come, by worker, and its
// outcome once every part came, one failed, or a worker waited too long.
type partsRound struct {
	num   int
	parts map[int]WorkerPart
	done  chan struct{} // closed with err set
	err   error
}

// ServeLocal listens on the Unix socket addr ("@name" for Linux's
// abstract namespace, which needs no file and leaves none) and serves srv
// to its clients until Close.
func ServeLocal(srv Backend, addr string, o LocalOptions) (*Local, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("loader: listen on %s: %w", addr, err)
	}
	status := o.Status
	if status == nil {
		status = func(error) int32 { return 1 }
	}
	l := &Local{srv: srv, ln: ln, status: status, conns: map[*net.UnixConn]struct{}{}, maxFrame: localMaxFrame(srv.Len())}
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

// Addr is the address the endpoint listens on.
func (l *Local) Addr() string { return l.ln.Addr().String() }

// Close stops accepting, closes every connection (their tickets' samples
// given back) and waits for their handlers.
func (l *Local) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	err := l.ln.Close()
	for c := range l.conns {
		_ = c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}

func (l *Local) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			return // closed
		}
		if !samePeer(c) {
			_ = c.Close()
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = c.Close()
			return
		}
		l.conns[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.serve(c)
	}
}

// samePeer reports whether the process at the other end of c runs as
// this process's user.
func samePeer(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	_ = raw.Control(func(fd uintptr) {
		cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		ok = err == nil && int(cred.Uid) == os.Getuid()
	})
	return ok
}

// localConn is one client's connection and the batches it got and has
// not taken.
type localConn struct {
	c       *net.UnixConn
	next    uint64
	tickets map[uint64][]Sample
	maps    []clientMap // the client's shared memories mapped, most recent last
}

// clientMap is a client's shared memory kept mapped between takes. A
// worker that reuses its buffers sends the same file each batch; mapping
// it afresh cost a page fault per page written (and zeroed pages on the
// first use of each), which with the DataLoader's own shared memory per
// batch made the kernel the largest share of an epoch's CPU (bench data,
// 100,000 files). A file is known by its device and inode, which stay its
// own while it is mapped here.
type clientMap struct {
	dev, ino uint64
	m        []byte
}

// clientMaps is how many of a client's shared memories stay mapped: a
// worker's buffers in use at once (pyfastensor's pool holds two), and a
// few the client dropped, unmapped as newer ones come.
const clientMaps = 4

// mapped returns the client's shared memory fd of size bytes mapped,
// from the connection's maps when the same file of the same size is
// there, else mapped now (populated: its pages are about to be written)
// and kept, the least recent unmapped beyond clientMaps.
func (lc *localConn) mapped(fd int, size uint64) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat the client's shared memory: %w", err)
	}
	dev, ino := uint64(st.Dev), st.Ino
	for k, cm := range lc.maps {
		if cm.dev == dev && cm.ino == ino && uint64(len(cm.m)) == size {
			lc.maps = append(append(lc.maps[:k:k], lc.maps[k+1:]...), cm)
			return cm.m, nil
		}
	}
	m, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("map the client's shared memory (%d bytes): %w", size, err)
	}
	if len(lc.maps) == clientMaps {
		_ = unix.Munmap(lc.maps[0].m)
		lc.maps = append(lc.maps[:0], lc.maps[1:]...)
	}
	lc.maps = append(lc.maps, clientMap{dev: dev, ino: ino, m: m})
	return m, nil
}

// unmapAll unmaps the client's shared memories (the connection ended).
func (lc *localConn) unmapAll() {
	for _, cm := range lc.maps {
		_ = unix.Munmap(cm.m)
	}
	lc.maps = nil
}

func (l *Local) serve(c *net.UnixConn) {
	lc := &localConn{c: c, tickets: map[uint64][]Sample{}}
	defer func() {
		for _, batch := range lc.tickets { // the client died holding them
			l.srv.Return(batch)
		}
		lc.unmapAll()
		l.mu.Lock()
		delete(l.conns, c)
		l.mu.Unlock()
		_ = c.Close()
		l.wg.Done()
	}()
	for {
		body, fds, err := readFrame(c, l.maxFrame)
		if err != nil {
			for _, fd := range fds {
				_ = unix.Close(fd)
			}
			if errors.Is(err, ErrInvalid) { // too large: say so before the connection ends
				_ = writeFrame(c, response(l.status(err), 0, 0, []byte(err.Error())))
			}
			return // EOF, a closed endpoint, a malformed frame: the connection ends
		}
		resp, ok := l.handle(lc, body, fds)
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
		if !ok {
			return
		}
		if err := writeFrame(c, resp); err != nil {
			return
		}
	}
}

// handle answers one request; ok false ends the connection (a request
// that does not parse).
func (l *Local) handle(lc *localConn, body []byte, fds []int) (resp []byte, ok bool) {
	if len(body) < 16 {
		return nil, false
	}
	op, n, arg := binary.LittleEndian.Uint32(body), int(binary.LittleEndian.Uint32(body[4:])), binary.LittleEndian.Uint64(body[8:])
	payload := body[16:]
	fail := func(err error) ([]byte, bool) {
		return response(l.status(err), 0, 0, []byte(err.Error())), true
	}
	switch op {
	case LocalHello:
		hello := LocalHelloInfo{Protocol: LocalProtocol, Samples: l.srv.Len(), Epoch: l.srv.Epoch(), PID: os.Getpid()}
		if r, ok := l.srv.(Resumable); ok {
			head := r.Head()
			hello.Epoch = head.Epoch
			hello.Part = &WorkerPart{Kind: WorkerPartKind, Version: WorkerPartVersion, StateHead: head}
			if _, ok := l.srv.(TurnBackend); ok {
				hello.Part.Version = WorkerPartTurnVersion
			}
		}
		info, err := json.Marshal(hello)
		if err != nil {
			return fail(err)
		}
		return response(0, 0, 0, info), true
	case LocalGet:
		inTurn, want := arg&LocalGetInTurn != 0, 8*n
		if inTurn {
			want += 8 // the wait
		}
		if len(payload) != want {
			return nil, false
		}
		is := make([]int, n)
		for k := range is {
			is[k] = int(int64(binary.LittleEndian.Uint64(payload[8*k:])))
		}
		var res InTurn
		var err error
		tb, turns := l.srv.(TurnBackend)
		if inTurn && turns {
			turn := Turn{Worker: int(arg >> 16 & 0xffff), Workers: int(arg >> 32 & 0xffff)}
			wait := time.Duration(binary.LittleEndian.Uint64(payload[8*n:])) * time.Millisecond
			if wait <= 0 || wait > 24*time.Hour {
				wait = LocalTurnWait
			}
			var stop func() bool
			gone := func() <-chan struct{} {
				ch, st := watchGone(lc.c)
				stop = st
				return ch
			}
			res, err = tb.GetBatchInTurn(turn, is, arg&LocalGetState != 0, wait, gone)
			if stop != nil && !stop() { // the client died waiting
				if err == nil {
					l.srv.Return(res.Samples)
				}
				return nil, false
			}
		} else {
			res.Samples, err = l.srv.GetBatch(is)
		}
		if err != nil {
			return fail(err)
		}
		batch := res.Samples
		lc.next++
		lc.tickets[lc.next] = batch
		size := 8*LocalMetaFields*n + 8
		var state []byte
		if inTurn {
			size += 8
			if res.State != nil {
				if state, err = json.Marshal(res.State); err != nil {
					return fail(err)
				}
			}
		}
		meta := make([]byte, size, size+len(state))
		epoch := l.srv.Epoch()
		for k, s := range batch {
			m := meta[8*LocalMetaFields*k:]
			for f, v := range [LocalMetaFields]int64{int64(s.Position), int64(s.Source), int64(s.Label), int64(len(s.Data))} {
				binary.LittleEndian.PutUint64(m[8*f:], uint64(v))
			}
			epoch = s.Epoch
		}
		binary.LittleEndian.PutUint64(meta[8*LocalMetaFields*n:], epoch)
		if inTurn {
			binary.LittleEndian.PutUint64(meta[8*LocalMetaFields*n+8:], res.Batch)
			meta = append(meta, state...)
		}
		return response(0, uint32(n), lc.next, meta), true
	case LocalTake:
		batch, found := lc.tickets[arg]
		switch {
		case len(payload) != 16:
			return nil, false
		case !found:
			return fail(fmt.Errorf("%w: no batch of ticket %d (taken already?)", ErrInvalid, arg))
		case n != len(batch):
			return fail(fmt.Errorf("%w: take of %d samples for the %d of ticket %d", ErrInvalid, n, len(batch), arg))
		case len(fds) != 1:
			return fail(fmt.Errorf("%w: take of ticket %d came with %d file descriptors, not one", ErrInvalid, arg, len(fds)))
		}
		off, size := binary.LittleEndian.Uint64(payload), binary.LittleEndian.Uint64(payload[8:])
		if err := lc.copyOut(fds[0], off, size, batch); err != nil {
			return fail(fmt.Errorf("loader: take of ticket %d: %w", arg, err))
		}
		delete(lc.tickets, arg)
		l.srv.Release(batch)
		return response(0, uint32(n), arg, nil), true
	case LocalReturn:
		if batch, found := lc.tickets[arg]; found {
			delete(lc.tickets, arg)
			l.srv.Return(batch)
		}
		return response(0, 0, arg, nil), true
	case LocalRestore:
		var part WorkerPart
		if err := json.Unmarshal(payload, &part); err != nil {
			return fail(fmt.Errorf("loader: %w: a worker's part that does not parse: %v", ErrState, err))
		}
		wait := time.Duration(arg) * time.Millisecond
		if arg == 0 || arg > uint64(time.Duration(math.MaxInt64)/time.Millisecond) {
			wait = LocalRestoreWait
		}
		if err := l.restorePart(lc.c, part, wait); err != nil {
			return fail(err)
		}
		return response(0, 0, 0, nil), true
	}
	return fail(fmt.Errorf("%w: unknown request %d (protocol %d)", gds.ErrUnsupported, op, LocalProtocol))
}

// restorePart adds a worker's part to the restore being collected (or
// starts one) and waits, up to wait, until the round has every worker's
// part and the backend restored the state they make, or failed; it returns the
// round's outcome, the same for each of its workers. A part that does
// not fit the round (another number of workers, or a worker's second
// part) fails the round, and every worker waiting in it. A worker whose
// connection closes while it waits takes its part back (a loader shut
// down mid-restore: its parts do not mix with the next one's). A worker
// that waits longer than its wait fails the round naming the workers
// missing.
func (l *Local) restorePart(c *net.UnixConn, part WorkerPart, wait time.Duration) error {
	r, ok := l.srv.(Resumable)
	if !ok {
		return fmt.Errorf("%w: loader: this server cannot restore DataLoader workers' parts of a state", gds.ErrUnsupported)
	}
	if part.NumWorkers < 1 || part.Worker < 0 || part.Worker >= part.NumWorkers {
		return fmt.Errorf("loader: %w: a part of worker %d of %d", ErrState, part.Worker, part.NumWorkers)
	}
	l.rmu.Lock()
	round := l.round
	if round == nil {
		round = &partsRound{num: part.NumWorkers, parts: map[int]WorkerPart{}, done: make(chan struct{})}
		l.round = round
	}
	switch _, twice := round.parts[part.Worker]; {
	case part.NumWorkers != round.num:
		err := l.endRound(round, fmt.Errorf("loader: %w: a part of a loader of %d workers came while the parts of one of %d were being collected",
			ErrState, part.NumWorkers, round.num))
		l.rmu.Unlock()
		return err
	case twice:
		err := l.endRound(round, fmt.Errorf("loader: %w: two parts of worker %d of %d", ErrState, part.Worker, round.num))
		l.rmu.Unlock()
		return err
	}
	round.parts[part.Worker] = part
	if len(round.parts) == round.num {
		parts := make([]WorkerPart, 0, round.num)
		for w := range round.num {
			parts = append(parts, round.parts[w])
		}
		err := l.endRound(round, r.RestoreParts(parts))
		l.rmu.Unlock()
		return err
	}
	l.rmu.Unlock()

	gone, stop := watchGone(c)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-round.done:
	case <-gone:
		l.rmu.Lock()
		if l.round == round {
			if delete(round.parts, part.Worker); len(round.parts) == 0 {
				l.endRound(round, nil) // no one waits in it: the next part starts a round of its own
			}
		}
		l.rmu.Unlock()
		return fmt.Errorf("loader: worker %d's connection closed while it waited for the others' parts", part.Worker)
	case <-timer.C:
		l.rmu.Lock()
		var missing []int
		for w := range round.num {
			if _, ok := round.parts[w]; !ok {
				missing = append(missing, w)
			}
		}
		l.endRound(round, fmt.Errorf("loader: %w: worker %d of %d waited %v for the parts of worker(s) %v: resume with a loader of as many workers, each loading its part",
			ErrIncomplete, part.Worker, round.num, wait, missing))
		l.rmu.Unlock()
	}
	if !stop() {
		return fmt.Errorf("loader: worker %d's connection closed while it waited for the others' parts", part.Worker)
	}
	return round.err
}

// endRound ends round with err (nil: restored), unless it ended already,
// and returns its outcome. The caller holds rmu.
func (l *Local) endRound(round *partsRound, err error) error {
	if l.round == round {
		l.round = nil
	}
	select {
	case <-round.done:
	default:
		round.err = err
		close(round.done)
	}
	return round.err
}

// watchGone reads c while its client waits for an answer and sends
// nothing: gone is closed when the read ends (the connection closed, or
// a byte the protocol does not allow here). stop ends the watch, leaving
// c as it was; false when the client is gone.
func watchGone(c *net.UnixConn) (gone <-chan struct{}, stop func() bool) {
	ch, exited := make(chan struct{}), make(chan struct{})
	var stopping atomic.Bool
	go func() {
		defer close(exited)
		var b [1]byte
		_, err := c.Read(b[:])
		if !stopping.Load() || !errors.Is(err, os.ErrDeadlineExceeded) {
			close(ch)
		}
	}()
	return ch, func() bool {
		stopping.Store(true)
		_ = c.SetReadDeadline(time.Now())
		<-exited
		_ = c.SetReadDeadline(time.Time{})
		select {
		case <-ch:
			return false
		default:
			return true
		}
	}
}

// copyOut writes batch's bytes back to back from off into the shared
// memory fd of size bytes (mapped, or kept mapped: mapped).
func (lc *localConn) copyOut(fd int, off, size uint64, batch []Sample) error {
	var total uint64
	for _, s := range batch {
		total += uint64(len(s.Data))
	}
	if off > size || total > size-off {
		return fmt.Errorf("%w: %d bytes from offset %d do not fit the client's %d bytes", ErrInvalid, total, off, size)
	}
	if total == 0 {
		return nil
	}
	if size > 1<<46 {
		return fmt.Errorf("%w: a shared memory of %d bytes", ErrInvalid, size)
	}
	m, err := lc.mapped(fd, size)
	if err != nil {
		return err
	}
	at := off
	for _, s := range batch {
		at += uint64(copy(m[at:], s.Data))
	}
	return nil
}

func response(status int32, n uint32, ticket uint64, payload []byte) []byte {
	b := make([]byte, 4+16+len(payload))
	binary.LittleEndian.PutUint32(b, uint32(16+len(payload)))
	binary.LittleEndian.PutUint32(b[4:], uint32(status))
	binary.LittleEndian.PutUint32(b[8:], n)
	binary.LittleEndian.PutUint64(b[12:], ticket)
	copy(b[20:], payload)
	return b
}

func writeFrame(c *net.UnixConn, b []byte) error {
	_, err := c.Write(b)
	return err
}

// readFrame reads one frame's body and the file descriptors that came
// with it.
// A frame larger than limit is refused (ErrInvalid) unread.
func readFrame(c *net.UnixConn, limit uint32) (body []byte, fds []int, err error) {
	var head [4]byte
	if fds, err = readFull(c, head[:], nil); err != nil {
		return nil, fds, err
	}
	size := binary.LittleEndian.Uint32(head[:])
	if size > limit {
		return nil, fds, fmt.Errorf("%w: a request of %d bytes, over this server's limit of %d", ErrInvalid, size, limit)
	}
	body = make([]byte, size)
	fds, err = readFull(c, body, fds)
	return body, fds, err
}

// readFull fills b from c, collecting the file descriptors of any
// SCM_RIGHTS message that arrives with its bytes.
func readFull(c *net.UnixConn, b []byte, fds []int) ([]int, error) {
	oob := make([]byte, unix.CmsgSpace(4*4))
	for len(b) > 0 {
		n, oobn, _, _, err := c.ReadMsgUnix(b, oob)
		if oobn > 0 {
			msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
			if perr == nil {
				for _, m := range msgs {
					if got, rerr := unix.ParseUnixRights(&m); rerr == nil {
						fds = append(fds, got...)
					}
				}
			}
		}
		if n == 0 && err == nil {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			if errors.Is(err, io.EOF) && n > 0 {
				err = io.ErrUnexpectedEOF
			}
			return fds, err
		}
		b = b[n:]
	}
	return fds, nil
}
