package checkpoint

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The commit protocol of a save:
//
//  1. write everything to a temporary file in the target's directory,
//     named .<target>.pyfastensor-tmp-<pid>-<random>, preallocated to its
//     final length (so a full disk fails before any byte is written);
//  2. fsync it;
//  3. rename it over the target (atomic within a directory);
//  4. fsync the directory, so the rename itself survives a crash.
//
// A crash at any point leaves either the old target or the new one. What a
// crash can leave besides is the temporary file: its name carries the pid
// of the process that wrote it, and the next save to the same target
// removes those whose process is gone. Loads never look at them.
//
// Durable=false skips steps 2 and 4: the rename still makes the switch
// atomic for readers, but a power loss may lose or tear the new file.

// tempMarker is the part of a temporary file's name that marks it as ours.
const tempMarker = ".pyfastensor-tmp-"

// tempPrefix is the name prefix of every temporary file for target.
func tempPrefix(target string) string {
	return "." + filepath.Base(target) + tempMarker
}

// IsTempName reports whether a file name (base name) is one of our
// temporary files.
func IsTempName(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, tempMarker)
}

// tempPath returns a fresh temporary path for target, in its directory.
func tempPath(target string) string {
	var r [6]byte
	_, _ = rand.Read(r[:])
	name := fmt.Sprintf("%s%d-%s", tempPrefix(target), os.Getpid(), hex.EncodeToString(r[:]))
	return filepath.Join(filepath.Dir(target), name)
}

// tempPid returns the pid encoded in a temporary file name of target.
func tempPid(target, name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, tempPrefix(target))
	if !ok {
		return 0, false
	}
	pidText, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(pidText)
	return pid, err == nil && pid > 0
}

// processGone reports whether no process has this pid (kill(pid, 0) gives
// ESRCH). A pid reused by another process counts as alive: its file stays,
// which is the safe mistake.
func processGone(pid int) bool {
	return errors.Is(unix.Kill(pid, 0), unix.ESRCH)
}

// CleanStale removes the temporary files that saves to target left behind
// in processes that no longer exist, and returns their paths. Files of
// live processes (including this one) are left alone.
func CleanStale(target string) []string {
	dir := filepath.Dir(target)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var removed []string
	for _, e := range entries {
		pid, ok := tempPid(target, e.Name())
		if !ok || !processGone(pid) {
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
// any (else 0666 less the umask, as torch.save's files get). On error
// nothing is left behind.
func createTemp(target string, size int64) (string, error) {
	path := tempPath(target)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
	if err != nil {
		return "", fmt.Errorf("cannot create a temporary file in %s: %w", filepath.Dir(target), classify(err))
	}
	if st, serr := os.Stat(target); serr == nil {
		err = f.Chmod(st.Mode().Perm())
	}
	if err == nil {
		err = reserve(f, size)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return "", fmt.Errorf("cannot reserve %d bytes for %s: %w", size, target, classify(err))
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

// commit renames tmp over target and, when durable, fsyncs the directory.
func commit(tmp, target string, durable bool) error {
	if err := os.Rename(tmp, target); err != nil {
		return classify(err)
	}
	if !durable {
		return nil
	}
	return syncDir(filepath.Dir(target))
}

// syncDir fsyncs a directory, making renames in it durable.
func syncDir(dir string) error {
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
