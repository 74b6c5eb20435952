package transfer

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
)

// FSOp names a step of the commit protocol, as an FS sees it.
type FSOp string

// The steps.
const (
	FSCreate  FSOp = "create"
	FSReserve FSOp = "reserve"
	FSSync    FSOp = "sync"
	FSRename  FSOp = "rename"
	FSSyncDir FSOp = "syncdir"
	FSRemove  FSOp = "remove"
)

// FaultFS is an FS that fails the steps Fail chooses, pebble-style: Fail
// sees each step (its kind, path and how many steps came before it) and
// returns the error to fail it with, or nil to let it through to Base.
// Return a syscall.Errno (ENOSPC, EROFS, EIO ...) to have it classified as
// a real one would be. Safe for concurrent use when Fail is.
type FaultFS struct {
	Base FS
	Fail func(op FSOp, path string, n int64) error

	n atomic.Int64
}

var _ FS = (*FaultFS)(nil)

func (f *FaultFS) check(op FSOp, path string) error {
	if err := f.Fail(op, path, f.n.Add(1)-1); err != nil {
		return &os.PathError{Op: string(op), Path: path, Err: err}
	}
	return nil
}

// Create implements FS.
func (f *FaultFS) Create(path string, perm os.FileMode) error {
	if err := f.check(FSCreate, path); err != nil {
		return err
	}
	return f.Base.Create(path, perm)
}

// Reserve implements FS.
func (f *FaultFS) Reserve(path string, size int64) error {
	if err := f.check(FSReserve, path); err != nil {
		return err
	}
	return f.Base.Reserve(path, size)
}

// Sync implements FS.
func (f *FaultFS) Sync(path string) error {
	if err := f.check(FSSync, path); err != nil {
		return err
	}
	return f.Base.Sync(path)
}

// Rename implements FS.
func (f *FaultFS) Rename(oldpath, newpath string) error {
	if err := f.check(FSRename, newpath); err != nil {
		return err
	}
	return f.Base.Rename(oldpath, newpath)
}

// SyncDir implements FS.
func (f *FaultFS) SyncDir(dir string) error {
	if err := f.check(FSSyncDir, dir); err != nil {
		return err
	}
	return f.Base.SyncDir(dir)
}

// Remove implements FS. Removal is how a failed write cleans up, so it is
// let through unless Fail says otherwise for FSRemove explicitly.
func (f *FaultFS) Remove(path string) error {
	if err := f.check(FSRemove, path); err != nil {
		return err
	}
	return f.Base.Remove(path)
}

// CrashFS records what a real filesystem would keep after a power loss at
// any point of a commit: file data as of its last Sync, and a directory's
// names as of its last SyncDir (pebble's CrashClone). Every step goes to
// Base as well, so the live directory is the one a process that did not
// crash sees. Crash at step k (Crash) refuses step k and every later one,
// as a process that stopped there would never have made them; CloneTo then
// writes the directory as it would come back.
//
// Only the directories whose names were synced or changed through it are
// tracked; files present before are taken as durable (Adopt them).
type CrashFS struct {
	Base FS

	mu      sync.Mutex
	inodes  map[string]int // live name -> inode
	names   map[string]int // durable name -> inode (as of the last SyncDir of its directory)
	data    map[int][]byte // inode -> durable content (as of its last Sync)
	next    int
	steps   int
	crashAt int // refuse step crashAt and later; -1: never
	// metadata, when set, lets renames and creates made after the last
	// SyncDir survive the crash as an in-order prefix of them (a
	// journaling filesystem commits metadata in order), chosen by
	// KeepPrefix; file data not synced is still dropped.
	pending    []func()
	KeepPrefix func(n int) int
}

// ErrCrashed is the error of every step at or after the crash point.
var ErrCrashed = fmt.Errorf("crashed (simulated power loss)")

// NewCrashFS tracks steps made through base, crashing at step crashAt
// (-1: never).
func NewCrashFS(base FS, crashAt int) *CrashFS {
	return &CrashFS{Base: base, inodes: map[string]int{}, names: map[string]int{}, data: map[int][]byte{}, crashAt: crashAt}
}

var _ FS = (*CrashFS)(nil)

// Adopt takes the file at path, as it is now, as durable.
func (c *CrashFS) Adopt(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	c.inodes[path], c.names[path], c.data[c.next] = c.next, c.next, b
	return nil
}

// Steps is the number of steps made (or refused).
func (c *CrashFS) Steps() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.steps
}

// step counts a step and says whether it may be made.
func (c *CrashFS) step() error {
	c.steps++
	if c.crashAt >= 0 && c.steps-1 >= c.crashAt {
		return ErrCrashed
	}
	return nil
}

// Create implements FS.
func (c *CrashFS) Create(path string, perm os.FileMode) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.step(); err != nil {
		return err
	}
	if err := c.Base.Create(path, perm); err != nil {
		return err
	}
	c.next++
	ino := c.next
	c.inodes[path] = ino
	c.data[ino] = nil // nothing synced yet
	c.pending = append(c.pending, func() { c.names[path] = ino })
	return nil
}

// Reserve implements FS (a length is not data: nothing becomes durable).
func (c *CrashFS) Reserve(path string, size int64) error {
	c.mu.Lock()
	if err := c.step(); err != nil {
		c.mu.Unlock()
		return err
	}
	c.mu.Unlock()
	return c.Base.Reserve(path, size)
}

// Sync implements FS: the file's bytes now become durable.
func (c *CrashFS) Sync(path string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.step(); err != nil {
		return err
	}
	if err := c.Base.Sync(path); err != nil {
		return err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if ino, ok := c.inodes[path]; ok {
		c.data[ino] = b
	}
	return nil
}

// Rename implements FS.
func (c *CrashFS) Rename(oldpath, newpath string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.step(); err != nil {
		return err
	}
	if err := c.Base.Rename(oldpath, newpath); err != nil {
		return err
	}
	ino := c.inodes[oldpath]
	delete(c.inodes, oldpath)
	c.inodes[newpath] = ino
	c.pending = append(c.pending, func() { delete(c.names, oldpath); c.names[newpath] = ino })
	return nil
}

// SyncDir implements FS: the directory's names now become durable.
func (c *CrashFS) SyncDir(dir string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.step(); err != nil {
		return err
	}
	if err := c.Base.SyncDir(dir); err != nil {
		return err
	}
	for name := range c.names {
		if filepath.Dir(name) == dir {
			delete(c.names, name)
		}
	}
	for name, ino := range c.inodes {
		if filepath.Dir(name) == dir {
			c.names[name] = ino
		}
	}
	c.pending = nil
	return nil
}

// Remove implements FS.
func (c *CrashFS) Remove(path string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.step(); err != nil {
		return err
	}
	if err := c.Base.Remove(path); err != nil {
		return err
	}
	delete(c.inodes, path)
	c.pending = append(c.pending, func() { delete(c.names, path) })
	return nil
}

// CloneTo writes into dir (which must exist) the files that would come
// back after a power loss now, each under its base name.
func (c *CrashFS) CloneTo(dir string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	names := make(map[string]int, len(c.names))
	for n, ino := range c.names {
		names[n] = ino
	}
	if c.KeepPrefix != nil {
		saved := c.names
		c.names = names
		for _, op := range c.pending[:c.KeepPrefix(len(c.pending))] {
			op()
		}
		names, c.names = c.names, saved
	}
	for name, ino := range names {
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(name)), c.data[ino], 0o644); err != nil {
			return err
		}
	}
	return nil
}
