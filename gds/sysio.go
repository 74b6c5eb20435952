package gds

import (
	"errors"
	"io"

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
