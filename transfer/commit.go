package transfer

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/pyfastensor/pyfastensor/gds"
)

// The commit protocol of a write (Create ... Commit):
//
//  1. write everything to a temporary file in the target's directory,
//     named .<target>.pyfastensor-tmp-<pid>@<pid namespace>-<random>
//     (pidSpace), preallocated to its
//     final length (so a full disk fails before any byte is written); a
//     target name too long for that to fit NAME_MAX is shortened in it
//     (tempBase);
//  2. fsync it;
//  3. rename it over the target (atomic within a directory);
//  4. fsync the directory, so the rename itself survives a crash.
//
// A crash at any point leaves either the old target or the new one. What a
// crash can leave besides is the temporary file: its name carries the pid
// of the process that wrote it, and the next save to the same target
// removes those whose process is gone. Loads never look at them.
//
// Durable=false skips steps 2 and 4, as torch.save and safetensors do: the
// rename still makes the switch atomic for readers, and a power loss on a
// filesystem that keeps only what was synced loses the new file and keeps
// the old. A filesystem that may commit the rename before the data it
// points to (a metadata journal without ordered data) may then show the
// target empty or partial; only durable=true rules that out
// (crash_test.go checks both models).
//
// Every step goes through an FS, so that tests inject faults (a full disk
// at the reservation, a read-only directory, a failing fsync) and crashes
// (a clone of the directory that keeps only what was synced) at each one.

// FS is the filesystem the commit protocol goes through. The data itself
// is written by the engines, on the temporary file Create makes; an FS
// sees the steps around it. Implementations are safe for concurrent use.
type FS interface {
	// Create creates path exclusively, empty, with permission perm (0:
	// 0666 less the umask), and closes it.
	Create(path string, perm os.FileMode) error
	// Reserve sets the length of the file at path to size, allocating its
	// blocks where the filesystem can (fallocate), so that a full disk
	// shows here, not halfway through the writes.
	Reserve(path string, size int64) error
	// Sync fsyncs the file at path (its data and metadata).
	Sync(path string) error
	// Rename renames oldpath to newpath, atomically within a directory.
	Rename(oldpath, newpath string) error
	// SyncDir fsyncs the directory dir, making renames in it durable.
	SyncDir(dir string) error
	// Remove removes path.
	Remove(path string) error
}

// OS is the real filesystem.
var OS FS = osFS{}

// defaultFS is what a write given no FS goes through: OS, or what
// SetDefaultFS installed (a process-wide fault, for tests of the layers
// above, down to the Python package, that cannot pass an FS themselves).
var defaultFS atomic.Pointer[FS]

// SetDefaultFS makes every write given no FS go through fsys until restore
// is called. Tests only: the setting is process-wide.
func SetDefaultFS(fsys FS) (restore func()) {
	old := defaultFS.Swap(&fsys)
	return func() { defaultFS.Store(old) }
}

// currentFS is the FS of a write given none.
func currentFS() FS {
	if p := defaultFS.Load(); p != nil {
		return *p
	}
	return OS
}

// CurrentFS is the FS a write given none goes through: OS, or what
// SetDefaultFS installed. Steps around a commit (removing what it
// replaced) take it, so that injected faults reach them too.
func CurrentFS() FS { return currentFS() }

type osFS struct{}

func (osFS) Create(path string, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
	if err != nil {
		return err
	}
	if perm != 0 {
		err = f.Chmod(perm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (osFS) Reserve(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = reserve(f, size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (osFS) Sync(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	return nil
}

func (osFS) Rename(oldpath, newpath string) error { return os.Rename(oldpath, newpath) }

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

func (osFS) Remove(path string) error { return os.Remove(path) }

// tempMarker is the part of a temporary file's name that marks it as ours.
const tempMarker = ".pyfastensor-tmp-"

// nameMax is the longest file name, in bytes, of the filesystems we write
// on: NAME_MAX of Linux's (ext4, XFS, Btrfs, tmpfs, NFS...).
const nameMax = 255

// tempBaseMax is the longest target base name a temporary name carries
// whole: "." + base + tempMarker + "<pid>@<8 hex>-<12 hex>" then fits
// nameMax for any pid up to 10 digits. A longer base name (a legal target
// of up to nameMax bytes) is carried shortened (tempBase).
const tempBaseMax = nameMax - 1 - len(tempMarker) - (10 + 1 + 8 + 1 + 12)

// tempBaseMaxNoSpace is tempBaseMax of the names that carried no pid
// namespace ("<pid>-<12 hex>"), which earlier versions wrote: their long
// base names were shortened less, and CleanStale still finds them.
const tempBaseMaxNoSpace = nameMax - 1 - len(tempMarker) - (10 + 1 + 12)

// foreignStaleAge is how long a temporary file of another pid namespace
// (another host on a shared filesystem, another container) must have gone
// unmodified before CleanStale removes it: whether its process lives cannot
// be asked from here, and a save in progress writes to its file far more
// often than that.
const foreignStaleAge = 24 * time.Hour

var (
	pidSpaceOnce sync.Once
	pidSpaceID   string
)

// pidSpace returns 8 hex digits naming the pid namespace this process's
// pid belongs to, across hosts: a hash of the kernel's boot id and the
// namespace's inode (the host name where either cannot be read). A
// temporary file carries it beside the pid, so that CleanStale asks
// whether a process is gone only of pids of its own namespace.
func pidSpace() string {
	pidSpaceOnce.Do(func() {
		h := sha256.New()
		boot, errBoot := os.ReadFile("/proc/sys/kernel/random/boot_id")
		ns, errNS := os.Readlink("/proc/self/ns/pid")
		h.Write(boot)
		h.Write([]byte{0})
		h.Write([]byte(ns))
		if errBoot != nil || errNS != nil {
			host, _ := os.Hostname()
			h.Write([]byte{0})
			h.Write([]byte(host))
		}
		pidSpaceID = hex.EncodeToString(h.Sum(nil)[:4])
	})
	return pidSpaceID
}

// tempTailMax is how many bytes of its end a shortened base name keeps
// (its extension, which IsDCPDataFile and the like look at).
const tempTailMax = 16

// tempBase returns what stands for target's base name in its temporary
// names: the base name when it is at most tempBaseMax bytes, else
// "<head>~<16 hex>~<tail>", tempBaseMax bytes at most: the name's first
// and last bytes (cut at UTF-8 character starts) around 64 bits of its
// SHA-256, so that two long names rarely share temporary names, and each
// target's are found again by name (CleanStale).
func tempBase(base string) string { return shortened(base, tempBaseMax) }

// shortened is base, or "<head>~<16 hex>~<tail>" of at most most bytes
// when base is longer (tempBase).
func shortened(base string, most int) string {
	if len(base) <= most {
		return base
	}
	sum := sha256.Sum256([]byte(base))
	j := len(base) - tempTailMax
	for j < len(base) && !utf8.RuneStart(base[j]) {
		j++
	}
	tail := base[j:]
	i := most - 2 - 16 - len(tail)
	for i > 0 && !utf8.RuneStart(base[i]) {
		i--
	}
	return base[:i] + "~" + hex.EncodeToString(sum[:8]) + "~" + tail
}

// tempPrefix is the name prefix of every temporary file for target.
func tempPrefix(target string) string {
	return "." + tempBase(filepath.Base(target)) + tempMarker
}

// IsTempName reports whether a file name (base name) is one of our
// temporary files.
func IsTempName(name string) bool {
	_, ok := TempTarget(name)
	return ok
}

// TempTarget returns the base name of the file a temporary file of ours
// (base name) was to replace, and whether it is one. For a target whose
// base name was too long to carry whole, that is the shortened name
// tempBase made of it, which keeps the name's start and end: CleanStale
// of a path with that name in the same directory cleans the same files.
func TempTarget(name string) (string, bool) {
	if !strings.HasPrefix(name, ".") {
		return "", false
	}
	target, _, ok := strings.Cut(name[1:], tempMarker)
	return target, ok
}

// tempPath returns a fresh temporary path for target, in its directory:
// a name of at most nameMax bytes, whatever the length of target's.
func tempPath(target string) string {
	var r [6]byte
	_, _ = rand.Read(r[:])
	name := fmt.Sprintf("%s%d@%s-%s", tempPrefix(target), os.Getpid(), pidSpace(), hex.EncodeToString(r[:]))
	return filepath.Join(filepath.Dir(target), name)
}

// tempPid returns the pid encoded in a temporary file name of target and
// the pid namespace it belongs to (pidSpace; "" in the names of earlier
// versions, which wrote none). A long base name's files carry it
// shortened (tempBase), shortened less where an earlier version wrote
// them without the namespace (tempBaseMaxNoSpace), or whole where an even
// earlier one did (which shortened nothing, and failed only where the whole name did not
// fit).
func tempPid(target, name string) (pid int, space string, ok bool) {
	base := filepath.Base(target)
	var rest string
	for _, b := range []string{tempBase(base), shortened(base, tempBaseMaxNoSpace), base} {
		if rest, ok = strings.CutPrefix(name, "."+b+tempMarker); ok {
			break
		}
	}
	if !ok {
		return 0, "", false
	}
	pidText, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, "", false
	}
	pidText, space, _ = strings.Cut(pidText, "@")
	pid, err := strconv.Atoi(pidText)
	return pid, space, err == nil && pid > 0
}

// processGone reports whether no process has this pid (kill(pid, 0) gives
// ESRCH). A pid reused by another process counts as alive: its file stays,
// which is the safe mistake.
func processGone(pid int) bool {
	return errors.Is(unix.Kill(pid, 0), unix.ESRCH)
}

// abandoned reports whether the temporary file name (in dir) of a save
// by pid, in pid namespace space, is left over: its process is gone, where
// that can be asked (this namespace, or a name without one); else the file
// has not been modified for foreignStaleAge.
func abandoned(dir, name string, pid int, space string) bool {
	if space == "" || space == pidSpace() {
		return processGone(pid)
	}
	st, err := os.Lstat(filepath.Join(dir, name))
	return err == nil && time.Since(st.ModTime()) > foreignStaleAge
}

// CleanStale removes the temporary files that saves to target left behind
// in processes that no longer exist, and returns their paths. Files of
// live processes (including this one) are left alone, and so are those
// of another host or pid namespace (a shared filesystem, containers)
// modified within foreignStaleAge: their processes cannot be asked.
func CleanStale(target string) []string {
	dir := filepath.Dir(target)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var removed []string
	for _, e := range entries {
		pid, space, ok := tempPid(target, e.Name())
		if !ok || !abandoned(dir, e.Name(), pid, space) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if os.Remove(p) == nil {
			removed = append(removed, p)
		}
	}
	return removed
}

// resolveTarget returns the file a save to path replaces: path itself, or
// what it links to when it is a symbolic link (torch.save writes through
// links too; renaming over the link would replace the link instead).
func resolveTarget(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		return real, nil
	}
	return abs, nil
}

// createTemp creates the temporary file for target and reserves size bytes
// for it. It takes the permission bits of the file it will replace, if
// any (else 0666 less the umask, as torch.save's files get). A target
// whose name the filesystem refuses as too long, or that is a directory,
// is refused here with an error wrapping syscall.ENAMETOOLONG or EISDIR,
// before anything is written. On error nothing is left behind.
func createTemp(fsys FS, target string, size int64) (string, error) {
	path := tempPath(target)
	var perm os.FileMode
	st, err := os.Stat(target)
	switch {
	case err == nil && st.IsDir():
		// Refused here too: the rename would fail only after every byte was written.
		return "", fmt.Errorf("cannot write %s: %w", target, syscall.EISDIR)
	case err == nil:
		perm = st.Mode().Perm()
	case errors.Is(err, syscall.ENAMETOOLONG):
		// Refused here, before a byte is written, not at the rename.
		return "", fmt.Errorf("cannot write %s: %w", target, syscall.ENAMETOOLONG)
	}
	if err := fsys.Create(path, perm); err != nil {
		_ = fsys.Remove(path)
		return "", fmt.Errorf("cannot create a temporary file in %s: %w", filepath.Dir(target), gds.Classify(err))
	}
	if err := fsys.Reserve(path, size); err != nil {
		_ = fsys.Remove(path)
		return "", fmt.Errorf("cannot reserve %d bytes for %s: %w", size, target, gds.Classify(err))
	}
	return path, nil
}

// reserve sets f's length to size, allocating the blocks where the
// filesystem can (fallocate), so that a full disk shows here, not halfway
// through the writes.
func reserve(f *os.File, size int64) error {
	if size == 0 {
		return nil
	}
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, syscall.ENOSYS) {
		return &os.PathError{Op: "fallocate", Path: f.Name(), Err: err}
	}
	return f.Truncate(size)
}

// commit puts tmp in target's place: fsync tmp, rename, fsync the
// directory (durable), or the rename alone. The file it replaces is freed
// after it returns (replaced.go).
func commit(fsys FS, tmp, target string, durable bool) error {
	if durable {
		if err := fsys.Sync(tmp); err != nil {
			return gds.Classify(err)
		}
	}
	defer release(holdReplaced(target))
	if err := fsys.Rename(tmp, target); err != nil {
		return gds.Classify(err)
	}
	if !durable {
		return nil
	}
	return gds.Classify(fsys.SyncDir(filepath.Dir(target)))
}
