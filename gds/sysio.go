package gds

import (
	"errors"
	"io"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// preadFull reads len(p) bytes at off from fd, retrying short reads and
// EINTR. It returns io.EOF (with the count) when the file ends first.
func preadFull(fd int, p []byte, off int64) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Pread(fd, p[done:], off+int64(done))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, io.EOF
		}
		done += n
	}
	return done, nil
}

// pwriteFull writes all of p at off to fd, retrying short writes and EINTR.
func pwriteFull(fd int, p []byte, off int64) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Pwrite(fd, p[done:], off+int64(done))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, io.ErrShortWrite
		}
		done += n
	}
	return done, nil
}

// openFD opens path with flags (os.O_* values, which equal unix.O_* on Linux)
// and close-on-exec set.
func openFD(path string, flag int, perm uint32) (int, error) {
	for {
		fd, err := unix.Open(path, flag|unix.O_CLOEXEC, perm)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return fd, err
	}
}

// directOpenFaults, when set, is consulted before every open with O_DIRECT
// (see InjectDirectOpen).
var directOpenFaults atomic.Pointer[Injector]

// openDirect opens path with O_DIRECT added to flag, for the direct and
// uring engines' Open and ProbeDir's probe, so that a test can make it
// fail. (The cufile engine opens its own: it falls back to cuFile's
// compatibility mode, not to posix.)
func openDirect(path string, flag int, perm uint32) (int, error) {
	if inj := directOpenFaults.Load(); inj != nil {
		if err := (*inj).MaybeError(FaultOp{Kind: OpOpen, Path: path}); err != nil {
			if errors.Is(err, unix.EINVAL) && flag&unix.O_CREAT != 0 {
				// As Linux refuses O_DIRECT: after the file is created (or
				// refused for O_EXCL, which comes first).
				fd, cerr := openFD(path, flag, perm)
				if cerr != nil {
					return -1, cerr
				}
				unix.Close(fd)
			}
			return -1, injected(err)
		}
	}
	return openFD(path, flag|unix.O_DIRECT, perm)
}

// InjectDirectOpen makes every open with O_DIRECT in this process by the
// direct and uring engines' Open and by ProbeDir ask inj first and fail
// with its error, until restore is called. A test on any filesystem can so
// play one that refuses O_DIRECT:
//
//	defer gds.InjectDirectOpen(gds.Only(gds.OpOpen).WithError(unix.EINVAL))()
//
// The setting is process-wide: a test that uses it must not run in
// parallel with tests that open files with O_DIRECT.
func InjectDirectOpen(inj Injector) (restore func()) {
	old := directOpenFaults.Swap(&inj)
	return func() { directOpenFaults.Store(old) }
}
