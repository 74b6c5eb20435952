package gds

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// DirInfo says what a directory's filesystem supports, for info() and for
// choosing engines.
type DirInfo struct {
	Dir    string `json:"dir"`
	FSType string `json:"fs_type"`
	// Direct is true when O_DIRECT opens and a write+read of one aligned
	// block succeeds; DirectReason says why not otherwise.
	Direct       bool   `json:"o_direct"`
	DirectReason string `json:"o_direct_reason,omitempty"`
	// MemAlign and OffsetAlign are the alignments O_DIRECT needs, from
	// statx STATX_DIOALIGN ("statx") or found by trying ("probe").
	MemAlign    int    `json:"dio_mem_align,omitempty"`
	OffsetAlign int    `json:"dio_offset_align,omitempty"`
	AlignSource string `json:"dio_align_source,omitempty"`
}

// fsNames maps statfs magic numbers to names, for the filesystems training
// jobs meet.
var fsNames = map[int64]string{
	0xEF53: "ext4", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x01021994: "tmpfs",
	0x794c7630: "overlayfs", 0x6969: "nfs", 0x2fc12fc1: "zfs", 0xF2F52010: "f2fs",
	0x65735546: "fuse", 0x01021997: "9p", 0x73717368: "squashfs", 0xff534d42: "cifs",
	0x6a656a63: "virtiofs", 0x47504653: "gpfs", 0x0bd00bd0: "lustre", 0xde5e81e4: "efivarfs",
}

// FSType names the filesystem holding path ("ext4", "tmpfs", ... or the
// magic number in hex when unknown).
func FSType(path string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return "", fmt.Errorf("statfs %s: %w", path, err)
	}
	if n, ok := fsNames[int64(st.Type)]; ok {
		return n, nil
	}
	return fmt.Sprintf("0x%x", st.Type), nil
}

// ProbeDir examines dir with a small unlinked temporary file.
func ProbeDir(dir string) DirInfo {
	info := DirInfo{Dir: dir}
	fs, err := FSType(dir)
	if err != nil {
		info.FSType = "unknown"
		info.DirectReason = err.Error()
		return info
	}
	info.FSType = fs
	info.Direct, info.MemAlign, info.OffsetAlign, info.AlignSource, info.DirectReason = probeDirect(dir)
	return info
}

// probeDirect opens a temporary file in dir with O_DIRECT and moves one
// block through it, at the alignment statx reports or, without statx's
// answer, at 512 then 4096 bytes.
func probeDirect(dir string) (ok bool, mem, off int, source, reason string) {
	tmp, err := os.CreateTemp(dir, ".pyfastensor-probe-*")
	if err != nil {
		return false, 0, 0, "", fmt.Sprintf("cannot create a file in %s: %v", dir, err)
	}
	name := tmp.Name()
	tmp.Close()
	defer os.Remove(name)

	fd, err := openDirect(name, os.O_RDWR, 0o600)
	if errors.Is(err, unix.EINVAL) {
		return false, 0, 0, "", fmt.Sprintf("%v: open with O_DIRECT gave EINVAL", ErrNoDirectIO)
	}
	if err != nil {
		return false, 0, 0, "", fmt.Sprintf("open with O_DIRECT: %v", err)
	}
	defer unix.Close(fd)

	var st unix.Statx_t
	if unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st) == nil &&
		st.Mask&unix.STATX_DIOALIGN != 0 && st.Dio_offset_align != 0 {
		mem, off = max(int(st.Dio_mem_align), 1), int(st.Dio_offset_align)
		if err := tryBlock(fd, mem, off); err != nil {
			return false, mem, off, "statx", fmt.Sprintf("O_DIRECT transfer at statx alignment failed: %v", err)
		}
		return true, mem, off, "statx", ""
	}
	var last error
	for _, a := range []int{512, 4096} {
		if last = tryBlock(fd, a, a); last == nil {
			return true, a, a, "probe", ""
		}
	}
	return false, 0, 0, "probe", fmt.Sprintf("O_DIRECT transfer failed at 512 and 4096 alignment: %v", last)
}

// tryBlock writes and reads back one block of off bytes at offset off from
// memory aligned to mem.
func tryBlock(fd, mem, off int) error {
	buf := alignedBuf(max(off, 512), max(mem, 1))
	for i := range buf {
		buf[i] = byte(i)
	}
	if _, err := pwriteFull(fd, buf, int64(off)); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	got := alignedBuf(len(buf), max(mem, 1))
	if _, err := preadFull(fd, got, int64(off)); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if string(got) != string(buf) {
		return errors.New("read back differs from what was written")
	}
	return nil
}
