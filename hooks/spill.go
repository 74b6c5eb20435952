package hooks

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// growStep is the least the spill file grows by, so that a run of small
// slots does not resize the file on every put. Growth is sparse (ftruncate):
// disk blocks are only taken when slots are written.
const growStep = 64 << 20

// noTmpfile makes openSpill act as on a filesystem without O_TMPFILE (tests).
var noTmpfile = false

// spillFile is the ssd tier: one unlinked file in the spill directory,
// opened once per engine the picker may choose (all descriptors share the
// inode), with slots carved out of it by an allocator.
//
// Nothing is left behind: with O_TMPFILE the file never has a name; without
// it (filesystems that refuse O_TMPFILE) it is created under a temporary
// name and unlinked as soon as every engine has opened it. The inode goes
// when the last descriptor closes, at close or process exit.
type spillFile struct {
	dir    string
	how    string // "O_TMPFILE" or "unlink-after-open"
	fsType string
	anchor int // a plain descriptor that keeps the inode alive
	files  *transfer.Files
	picker Picker
	// opened are the engines the file is open through (the picker's
	// Engines when the store opened); fallback serves a name outside them.
	opened   map[string]bool
	fallback string
	slots    allocator

	// growMu orders growth against transfers: transfers hold it shared,
	// growth exclusively (gds.File forbids Truncate during transfers).
	growMu sync.RWMutex
	size   int64
}

var _ backend = (*spillFile)(nil)

// openSpill creates the spill file in dir. pick chooses the picker once the
// directory is known to be writable (it may probe the directory).
func openSpill(dir string, pick func() Picker, opts gds.Options) (_ *spillFile, err error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, spillDirError(dir, err)
	}
	if !st.IsDir() {
		return nil, spillDirError(dir, fmt.Errorf("%w: not a directory", gds.ErrInvalid))
	}
	s := &spillFile{dir: dir, anchor: -1}
	s.fsType, _ = gds.FSType(dir)
	defer func() {
		if err != nil {
			s.close()
		}
	}()

	// The anchor: an O_TMPFILE descriptor, or a named temporary file.
	path, named := "", ""
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err == nil && noTmpfile {
		unix.Close(fd)
		fd, err = -1, unix.EOPNOTSUPP
	}
	switch {
	case err == nil:
		s.how, s.anchor = "O_TMPFILE", fd
		// Every engine reopens the inode through the descriptor's magic
		// link, which works for O_TMPFILE files (they were not opened with
		// O_EXCL).
		path = fmt.Sprintf("/proc/self/fd/%d", fd)
	case errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EINVAL):
		tmp, terr := os.CreateTemp(dir, ".pyfastensor-spill-*")
		if terr != nil {
			return nil, spillDirError(dir, terr)
		}
		named = tmp.Name()
		defer os.Remove(named) // unlinked once every engine has it open
		tmp.Close()
		if s.anchor, err = unix.Open(named, unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			return nil, spillDirError(dir, err)
		}
		s.how, path = "unlink-after-open", named
	default:
		return nil, spillDirError(dir, err)
	}

	s.picker = pick()
	// Slots hold host memory (the offload stages device tensors through
	// pinned buffers): where cuFile fails, a CPU engine serves the file.
	s.files = transfer.NewFiles(path, os.O_RDWR, opts, nil).HostMemory()
	engines := s.picker.Engines()
	if err := s.files.Open(engines...); err != nil {
		return nil, fmt.Errorf("spill file in %s: %w", dir, err)
	}
	s.opened, s.fallback = map[string]bool{}, engines[0]
	for _, e := range engines {
		s.opened[e] = true
	}
	return s, nil
}

// engine returns the engine the picker names, or the first engine it lists
// for a name it does not know (the store opened only those).
func (s *spillFile) engine(op Op, n int64) string {
	name := s.picker.Engine(op, n)
	if s.opened[name] {
		return name
	}
	return s.fallback
}

func (s *spillFile) alloc(n int64) (extent, error) {
	e, end := s.slots.alloc(n)
	if err := s.grow(end); err != nil {
		s.slots.release(e)
		return extent{}, err
	}
	return e, nil
}

// grow makes the file at least end bytes long, by at least growStep or a
// quarter of its size, so growth is rare. Every engine's file is truncated
// (not just one) because an engine may cache the length it last saw.
func (s *spillFile) grow(end int64) error {
	s.growMu.RLock()
	ok := end <= s.size
	s.growMu.RUnlock()
	if ok {
		return nil
	}
	s.growMu.Lock()
	defer s.growMu.Unlock()
	if end <= s.size {
		return nil
	}
	target := roundSlot(max(end, s.size+max(growStep, s.size/4)))
	err := s.files.Each(func(_ string, f gds.File) error {
		if err := f.Truncate(target); err != nil {
			// A filesystem may refuse a sparse length past its size;
			// try exactly what is needed before giving up.
			if err = f.Truncate(end); err != nil {
				return fmt.Errorf("spill file in %s: growing to %d bytes: %w", s.dir, end, err)
			}
			target = end
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.size = target
	return nil
}

func (s *spillFile) release(e extent) { s.slots.release(e) }

func (s *spillFile) write(e extent, p []byte) (string, error) {
	return s.transfer(OpWrite, e, p)
}

func (s *spillFile) read(e extent, p []byte) (string, error) {
	return s.transfer(OpRead, e, p)
}

func (s *spillFile) transfer(op Op, e extent, p []byte) (string, error) {
	if int64(len(p)) > e.size {
		return "", fmt.Errorf("%w: %d bytes do not fit a slot of %d", gds.ErrInvalid, len(p), e.size)
	}
	s.growMu.RLock()
	defer s.growMu.RUnlock()
	name := s.engine(op, int64(len(p)))
	if err := s.files.Move(op, name, s.picker, transfer.Extent{Off: e.off, Data: p}); err != nil {
		// The engine's error names engine, path (/proc/self/fd/N) and
		// offset; add the directory, which is what the user chose.
		return name, fmt.Errorf("spill file in %s: %w", s.dir, err)
	}
	return s.files.Serving(name), nil
}

func (s *spillFile) usage() (int64, int64, int64) {
	used, peak, _ := s.slots.snapshot()
	s.growMu.RLock()
	defer s.growMu.RUnlock()
	return used, peak, s.size
}

func (s *spillFile) describe() Description {
	d := Description{Tier: "ssd", Dir: s.dir, Spill: s.how, FSType: s.fsType}
	if s.picker != nil {
		d.Engines = s.picker.Engines()
	}
	if s.files != nil {
		var why []string
		if fb := s.files.Fallback(); fb != "" {
			why = append(why, fb)
		}
		_ = s.files.Each(func(_ string, f gds.File) error {
			if f.Fallback() != "" {
				why = append(why, f.Fallback())
			}
			return nil
		})
		d.Fallback = strings.Join(why, "; ")
	}
	return d
}

// close closes every descriptor; the unlinked inode and its blocks go with
// the last one.
func (s *spillFile) close() error {
	var errs []error
	if s.files != nil {
		errs = append(errs, s.files.Close())
	}
	if s.anchor >= 0 {
		if err := unix.Close(s.anchor); err != nil {
			errs = append(errs, fmt.Errorf("spill file in %s: close: %w", s.dir, err))
		}
		s.anchor = -1
	}
	return errors.Join(errs...)
}
