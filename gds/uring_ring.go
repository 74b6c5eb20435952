package gds

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The raw io_uring ring, written from the kernel ABI (include/uapi/linux/
// io_uring.h). A ring is two queues shared with the kernel through mmap:
//
//	SQ ring: head (kernel) | tail (us)   | index array -> SQE array
//	CQ ring: head (us)     | tail (kernel) | CQE array
//
// We fill SQEs, publish them by storing the SQ tail, and call io_uring_enter
// to submit them and wait; the kernel posts one CQE per request and advances
// the CQ tail, and we consume CQEs by storing the CQ head. Each index is a
// free-running uint32; the slot is index & mask. The indices the other side
// writes are read with atomic loads and ours are published with atomic
// stores, which order the SQE and CQE contents around them (the kernel uses
// acquire/release on the same words).
//
// An ioRing is not safe for concurrent use: one goroutine at a time (the
// ring pool in uring_pool.go hands each ring to one caller).

// Kernel ABI values used here.
const (
	ioringOpNop   = 0
	ioringOpRead  = 22 // IORING_OP_READ, Linux 5.6
	ioringOpWrite = 23 // IORING_OP_WRITE, Linux 5.6

	ioringEnterGetEvents = 1 << 0 // IORING_ENTER_GETEVENTS
	ioringFeatSingleMmap = 1 << 0 // IORING_FEAT_SINGLE_MMAP
	iosqeAsync           = 1 << 4 // IOSQE_ASYNC: issue from a kernel worker, blocking

	ioringOffSQRing = 0          // IORING_OFF_SQ_RING
	ioringOffCQRing = 0x8000000  // IORING_OFF_CQ_RING
	ioringOffSQEs   = 0x10000000 // IORING_OFF_SQES
)

// uringSQE is struct io_uring_sqe (64 bytes) with its unions reduced to the
// members a read or write uses.
type uringSQE struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	rwFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFdIn  int32
	addr3       uint64
	_           uint64
}

// uringCQE is struct io_uring_cqe (16 bytes; no IORING_SETUP_CQE32).
type uringCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

// uringSQOffsets is struct io_sqring_offsets: where each SQ ring field sits
// in the SQ ring mapping.
type uringSQOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

// uringCQOffsets is struct io_cqring_offsets.
type uringCQOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

// uringParams is struct io_uring_params, filled in by io_uring_setup.
type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  uringSQOffsets
	cqOff                                                                  uringCQOffsets
}

// Compile-time checks that the Go structs have the kernel's sizes.
var (
	_ [64]byte  = [unsafe.Sizeof(uringSQE{})]byte{}
	_ [16]byte  = [unsafe.Sizeof(uringCQE{})]byte{}
	_ [120]byte = [unsafe.Sizeof(uringParams{})]byte{}
)

// ioRing is one io_uring instance with its three mappings.
type ioRing struct {
	fd      int
	entries uint32 // SQ size; the CQ is at least as large

	sqMap, cqMap, sqeMap []byte // cqMap aliases sqMap under IORING_FEAT_SINGLE_MMAP

	sqHead, sqTail, sqMask *uint32
	cqHead, cqTail, cqMask *uint32
	sqes                   []uringSQE
	cqes                   []uringCQE

	tail    uint32 // our copy of the SQ tail, including SQEs not yet published
	pending uint32 // SQEs written but not yet consumed by io_uring_enter
	out     uint32 // requests consumed by the kernel whose CQEs are not reaped
}

// newIORing sets up a ring with at least entries submission slots.
func newIORing(entries uint32) (*ioRing, error) {
	var p uringParams
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &ioRing{fd: int(fd), entries: p.sqEntries}
	if err := r.mapRings(&p); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// mapRings maps the SQ ring, the CQ ring (the same mapping when the kernel
// offers IORING_FEAT_SINGLE_MMAP, Linux 5.4) and the SQE array, and points
// the ring's fields into them.
func (r *ioRing) mapRings(p *uringParams) error {
	const prot, flags = unix.PROT_READ | unix.PROT_WRITE, unix.MAP_SHARED | unix.MAP_POPULATE
	sqSize := int(p.sqOff.array) + int(p.sqEntries)*4
	cqSize := int(p.cqOff.cqes) + int(p.cqEntries)*int(unsafe.Sizeof(uringCQE{}))
	single := p.features&ioringFeatSingleMmap != 0
	if single {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	if r.sqMap, err = unix.Mmap(r.fd, ioringOffSQRing, sqSize, prot, flags); err != nil {
		return fmt.Errorf("io_uring mmap of the SQ ring: %w", err)
	}
	r.cqMap = r.sqMap
	if !single {
		if r.cqMap, err = unix.Mmap(r.fd, ioringOffCQRing, cqSize, prot, flags); err != nil {
			r.cqMap = nil
			return fmt.Errorf("io_uring mmap of the CQ ring: %w", err)
		}
	}
	sqeSize := int(p.sqEntries) * int(unsafe.Sizeof(uringSQE{}))
	if r.sqeMap, err = unix.Mmap(r.fd, ioringOffSQEs, sqeSize, prot, flags); err != nil {
		return fmt.Errorf("io_uring mmap of the SQE array: %w", err)
	}

	r.sqHead = word(r.sqMap, p.sqOff.head)
	r.sqTail = word(r.sqMap, p.sqOff.tail)
	r.sqMask = word(r.sqMap, p.sqOff.ringMask)
	r.cqHead = word(r.cqMap, p.cqOff.head)
	r.cqTail = word(r.cqMap, p.cqOff.tail)
	r.cqMask = word(r.cqMap, p.cqOff.ringMask)
	r.sqes = unsafe.Slice((*uringSQE)(unsafe.Pointer(&r.sqeMap[0])), p.sqEntries)
	r.cqes = unsafe.Slice((*uringCQE)(unsafe.Pointer(&r.cqMap[p.cqOff.cqes])), p.cqEntries)

	// The SQ index array maps ring slots to SQEs. Pointing slot i at SQE i
	// once, here, lets submission write only the SQE and the tail.
	array := unsafe.Slice(word(r.sqMap, p.sqOff.array), p.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}
	r.tail = atomic.LoadUint32(r.sqTail)
	return nil
}

// word points at the uint32 at byte offset off of a ring mapping.
func word(m []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&m[off])) }

// space is the number of free SQ slots.
func (r *ioRing) space() uint32 {
	return r.entries - (r.tail - atomic.LoadUint32(r.sqHead))
}

// prep writes one SQE for a read or write (op) of buf at off on fd. The
// kernel sees it at the next submit. The caller keeps buf reachable until
// the request's CQE is reaped; the ring stores only its address.
func (r *ioRing) prep(op uint8, flags uint8, fd int, buf []byte, off int64, userData uint64) {
	var addr uint64
	if len(buf) > 0 {
		addr = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	}
	r.sqes[r.tail&*r.sqMask] = uringSQE{
		opcode: op, flags: flags, fd: int32(fd),
		off: uint64(off), addr: addr, len: uint32(len(buf)), userData: userData,
	}
	r.tail++
	r.pending++
}

// submit publishes the prepared SQEs and calls io_uring_enter to submit them
// and wait until at least minComplete CQEs are available. EINTR is retried.
// EAGAIN and EBUSY (the kernel is short of request memory, or holds
// completions that overflowed the CQ) return nil when completions are ready
// to reap, so the caller reaps and comes back; otherwise the call waits for
// the requests already out, or with none out, retries after a pause for a
// while before giving up. Other errors are returned as they are.
func (r *ioRing) submit(minComplete uint32) error {
	atomic.StoreUint32(r.sqTail, r.tail)
	toSubmit := r.pending
	for tries := 0; ; tries++ {
		if r.out == 0 && toSubmit == 0 {
			minComplete = 0 // nothing to wait for: never block
		}
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd),
			uintptr(toSubmit), uintptr(minComplete), ioringEnterGetEvents, 0, 0)
		switch {
		case errno == 0:
			r.pending -= uint32(n)
			r.out += uint32(n)
			return nil
		case errno == unix.EINTR:
			continue
		case (errno == unix.EAGAIN || errno == unix.EBUSY) && tries < 1000:
			if r.ready() > 0 {
				return nil
			}
			if r.out > 0 {
				toSubmit = 0 // wait for the requests out to free resources
			} else {
				toSubmit = r.pending
				time.Sleep(time.Millisecond)
			}
		default:
			return fmt.Errorf("io_uring_enter: %w", errno)
		}
	}
}

// retract withdraws SQEs written but never consumed by the kernel, after a
// failed submit, and returns their user data. The kernel reads the SQ only
// inside io_uring_enter (no SQPOLL), so moving the tail back is safe.
func (r *ioRing) retract() []uint64 {
	var out []uint64
	for ; r.pending > 0; r.pending-- {
		r.tail--
		out = append(out, r.sqes[r.tail&*r.sqMask].userData)
	}
	atomic.StoreUint32(r.sqTail, r.tail)
	return out
}

// ready is the number of CQEs waiting to be reaped.
func (r *ioRing) ready() uint32 {
	return atomic.LoadUint32(r.cqTail) - atomic.LoadUint32(r.cqHead)
}

// reap hands every available CQE to fn and returns how many there were.
func (r *ioRing) reap(fn func(userData uint64, res int32)) int {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	mask := *r.cqMask
	for i := head; i != tail; i++ {
		c := r.cqes[i&mask]
		fn(c.userData, c.res)
	}
	atomic.StoreUint32(r.cqHead, tail)
	r.out -= min(r.out, tail-head)
	return int(tail - head)
}

// Close unmaps the ring and closes its descriptor. The kernel cancels or
// finishes any request still out; its memory must stay reachable until then
// (see uringOrphans).
func (r *ioRing) Close() error {
	var errs []error
	unmap := func(m []byte) {
		if m != nil {
			errs = append(errs, unix.Munmap(m))
		}
	}
	unmap(r.sqeMap)
	if r.cqMap != nil && (r.sqMap == nil || &r.cqMap[0] != &r.sqMap[0]) {
		unmap(r.cqMap) // a separate CQ mapping (no IORING_FEAT_SINGLE_MMAP)
	}
	unmap(r.sqMap)
	r.sqeMap, r.cqMap, r.sqMap, r.sqes, r.cqes = nil, nil, nil, nil, nil
	if r.fd >= 0 {
		errs = append(errs, unix.Close(r.fd))
		r.fd = -1
	}
	return errors.Join(errs...)
}
