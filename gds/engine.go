// Package gds moves bytes between memory and files through interchangeable
// I/O engines: posix (page cache), direct (O_DIRECT), uring (io_uring), mmap
// (read only) and cufile (GPUDirect Storage, loaded at run time).
//
// Every engine fits one contract, Engine and File below. The package knows
// nothing of tensors: a transfer is a byte slice and a file offset.
package gds

import (
	"os"
	"runtime"
)

// Engine opens files for one transfer method.
//
// Engines are safe for concurrent use: Open may be called from many
// goroutines.
type Engine interface {
	// Name is the engine's registry name ("posix", "direct", ...).
	Name() string
	// Open opens path with the os.O_* flags and permission of os.OpenFile.
	// An engine that cannot serve the file's filesystem either falls back
	// (the returned File reports why through Fallback) or returns an error
	// wrapping ErrUnavailable.
	Open(path string, flag int, perm os.FileMode) (File, error)
}

// File moves bytes between memory and one open file.
//
// Concurrency: ReadAt, WriteAt and Size may be called concurrently from many
// goroutines. Concurrent writes to disjoint ranges never disturb each other's
// bytes, even when the ranges share a disk block. Sync, Truncate and Close
// must not run concurrently with transfers.
//
// Memory: p is only used for the duration of the call and never retained.
// For the cufile engine p describes device memory and is never dereferenced
// by Go.
type File interface {
	// ReadAt fills p from offset off. It returns len(p), nil or an error
	// wrapping ErrEOF when the file ends before off+len(p) (with the count of
	// bytes that were read).
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt writes all of p at offset off, growing the file as needed. On
	// error the count says how many bytes were written before it.
	WriteAt(p []byte, off int64) (int, error)
	// Sync flushes written data and metadata to stable storage (fsync).
	Sync() error
	// Size returns the file's current length in bytes.
	Size() (int64, error)
	// Truncate sets the file's length.
	Truncate(size int64) error
	// Close releases the file. Further calls return an error wrapping ErrClosed.
	Close() error
	// Path is the path the file was opened with, or Options.Name.
	Path() string
	// Engine is the name of the engine that actually serves transfers; it
	// differs from the engine asked for only after a fallback.
	Engine() string
	// Fallback tells why this file is served by another engine than the one
	// asked for, or "" when it is not.
	Fallback() string
}

// Options tune how an engine splits and issues transfers. The zero value
// means the defaults.
type Options struct {
	// Threads is the number of goroutines one transfer is split across
	// (for uring: the number of rings per file, each used by one transfer
	// at a time). Default: the number of CPUs, at least 2.
	Threads int
	// TaskSize is the size in bytes of one piece of a split transfer.
	// Default: 8 MiB. Transfers smaller than two tasks run on the caller's
	// goroutine.
	TaskSize int64
	// QueueDepth is the number of requests in flight per io_uring ring.
	// Default: 32.
	QueueDepth int
	// CuFileLibrary is the path of libcufile to dlopen. Default: the
	// PYFASTENSOR_CUFILE_LIB environment variable, then the dynamic loader's
	// search for libcufile.so.0.
	CuFileLibrary string
	// Name is what errors call an opened file. Default: the path it was
	// opened by. A file reopened through /proc/self/fd/N keeps its own
	// name this way.
	Name string
}

// nameFor returns what errors call the file opened by path.
func (o Options) nameFor(path string) string {
	if o.Name != "" {
		return o.Name
	}
	return path
}

// Default option values.
const (
	DefaultTaskSize   = 8 << 20
	DefaultQueueDepth = 32
)

// withDefaults fills zero fields with their defaults.
func (o Options) withDefaults() Options {
	if o.Threads <= 0 {
		o.Threads = max(runtime.NumCPU(), 2)
	}
	if o.TaskSize <= 0 {
		o.TaskSize = DefaultTaskSize
	}
	if o.QueueDepth <= 0 {
		o.QueueDepth = DefaultQueueDepth
	}
	return o
}
