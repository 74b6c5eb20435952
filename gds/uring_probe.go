package gds

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// uringProbe caches the availability probe: it runs once per process.
var uringProbe struct {
	once   sync.Once
	ok     bool
	reason string
}

// ProbeUring reports whether io_uring works in this process and, when it
// does not, why in words. It sets up a ring and moves one byte through a
// memory file with IORING_OP_WRITE and IORING_OP_READ (Linux 5.6), once; the
// answer is cached.
func ProbeUring() (ok bool, reason string) {
	uringProbe.once.Do(func() {
		err := probeUring()
		uringProbe.ok = err == nil
		if err != nil {
			uringProbe.reason = err.Error()
		}
	})
	return uringProbe.ok, uringProbe.reason
}

func probeUring() error {
	r, err := newIORing(4)
	if err != nil {
		return explainSetup(err)
	}
	defer r.Close()

	fd, err := unix.MemfdCreate("pyfastensor-uring-probe", unix.MFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("memfd_create for the io_uring probe: %w", err)
	}
	defer unix.Close(fd)

	one := func(op uint8, name string, buf []byte) error {
		r.prep(op, 0, fd, buf, 0, uint64(op))
		res, got := int32(0), false
		for !got {
			if err := r.submit(1); err != nil {
				return err
			}
			r.reap(func(_ uint64, rs int32) { res, got = rs, true })
		}
		switch {
		case res == -int32(unix.EINVAL) && op != ioringOpNop:
			return fmt.Errorf("io_uring %s: %w (the kernel predates Linux 5.6?)", name, unix.EINVAL)
		case res < 0:
			return fmt.Errorf("io_uring %s: %w", name, syscall.Errno(-res))
		case res != int32(len(buf)):
			return fmt.Errorf("io_uring %s moved %d bytes of %d", name, res, len(buf))
		}
		return nil
	}
	in, out := []byte{0x5a}, []byte{0}
	if err := one(ioringOpNop, "NOP", nil); err != nil {
		return err
	}
	if err := one(ioringOpWrite, "IORING_OP_WRITE", in); err != nil {
		return err
	}
	if err := one(ioringOpRead, "IORING_OP_READ", out); err != nil {
		return err
	}
	if out[0] != in[0] {
		return errors.New("io_uring read back a different byte than it wrote")
	}
	return nil
}

// explainSetup adds the likely cause to an io_uring_setup failure.
func explainSetup(err error) error {
	switch {
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("%w (kernel without io_uring, or a seccomp filter answering ENOSYS)", err)
	case errors.Is(err, unix.EPERM):
		v, rerr := os.ReadFile("/proc/sys/kernel/io_uring_disabled")
		switch s := strings.TrimSpace(string(v)); {
		case rerr == nil && s == "2":
			return fmt.Errorf("%w (kernel.io_uring_disabled=2)", err)
		case rerr == nil && s == "1":
			return fmt.Errorf("%w (kernel.io_uring_disabled=1 and this process is not in kernel.io_uring_group)", err)
		}
		return fmt.Errorf("%w (a seccomp filter, such as a container runtime's, may block io_uring)", err)
	case errors.Is(err, unix.ENOMEM):
		return fmt.Errorf("%w (locked-memory limit too low? see ulimit -l)", err)
	}
	return err
}
