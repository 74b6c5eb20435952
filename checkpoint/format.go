package checkpoint

import (
	"encoding/binary"
)

// The zip structures this package reads and writes, byte for byte as
// PyTorch's writer (miniz, caffe2/serialize/inline_container.cc) lays them
// out, so stock torch.load and its offset arithmetic accept our files:
//
//	local header | name | extra: [zip64] "FB" padding | data | data descriptor
//	... one per record ...
//	central directory | zip64 end record | zip64 locator | end record | comment
//
// Records are stored (method 0). A record with data sets flag bit 3: the
// local header's CRC and sizes are zero and a data descriptor follows the
// data; an empty record has neither. Zip64 fields appear for a size or an
// offset of 0xFFFFFFFF or more, as miniz does. The zip64 end record is
// always written, as torch does.

const (
	sigLocal      = 0x04034b50
	sigCentral    = 0x02014b50
	sigDescriptor = 0x08074b50
	sigEnd        = 0x06054b50
	sigEnd64      = 0x06064b50
	sigLocator64  = 0x07064b50

	localHeaderLen = 30
	centralLen     = 46
	endLen         = 22
	end64Len       = 56
	locator64Len   = 20

	flagDescriptor = 0x0008 // CRC and sizes follow the data
	flagUTF8       = 0x0800 // names are UTF-8

	versionPlain = 20
	versionZip64 = 45

	max32 = 0xFFFFFFFF
	max16 = 0xFFFF

	extraZip64 = 0x0001
	extraPad   = 0x4246 // "FB": torch's padding extra field
)

// needsZip64 reports whether a record of size bytes whose local header sits
// at off needs zip64 fields (miniz's rule).
func needsZip64(off, size int64) bool { return off >= max32 || size >= max32 }

// zip64ExtraLen is the length of the zip64 extra field of a record's local
// header and central entry: sizes when the size needs it, offset when the
// offset needs it (0 when neither).
func zip64ExtraLen(off, size int64) int {
	n := 0
	if size >= max32 {
		n += 16
	}
	if off >= max32 {
		n += 8
	}
	if n == 0 {
		return 0
	}
	return 4 + n
}

// paddingLen returns how many padding bytes (after the 4-byte "FB" header)
// put the data of a record named name, whose local header starts at off, on
// a multiple of align. Same arithmetic as torch's detail::getPadding.
func paddingLen(off int64, nameLen int, size, align int64) int64 {
	start := off + localHeaderLen + int64(nameLen) + 4 + int64(zip64ExtraLen(off, size))
	return (align - start%align) % align
}

// descriptorLen is the data descriptor's length: none for empty records,
// 24 bytes with 64-bit sizes for zip64 records, 16 otherwise.
func descriptorLen(off, size int64) int64 {
	switch {
	case size == 0:
		return 0
	case needsZip64(off, size):
		return 24
	}
	return 16
}

// flagsFor returns the general-purpose flags of a record.
func flagsFor(size int64) uint16 {
	if size == 0 {
		return flagUTF8
	}
	return flagUTF8 | flagDescriptor
}

func versionFor(off, size int64) uint16 {
	if needsZip64(off, size) {
		return versionZip64
	}
	return versionPlain
}

// appendZip64Extra appends the zip64 extra field (uncompressed size,
// compressed size, local header offset, each only where needed).
func appendZip64Extra(b []byte, off, size int64) []byte {
	n := zip64ExtraLen(off, size)
	if n == 0 {
		return b
	}
	b = binary.LittleEndian.AppendUint16(b, extraZip64)
	b = binary.LittleEndian.AppendUint16(b, uint16(n-4))
	if size >= max32 {
		b = binary.LittleEndian.AppendUint64(b, uint64(size))
		b = binary.LittleEndian.AppendUint64(b, uint64(size))
	}
	if off >= max32 {
		b = binary.LittleEndian.AppendUint64(b, uint64(off))
	}
	return b
}

// clamp32 returns v, or 0xFFFFFFFF when v needs a zip64 field.
func clamp32(v int64) uint32 {
	if v >= max32 {
		return max32
	}
	return uint32(v)
}

// localHeader encodes a record's local header, name and extra field
// (zip64 when needed, then "FB" with pad bytes of 'Z').
func localHeader(name string, off, size, pad int64) []byte {
	le := binary.LittleEndian
	b := make([]byte, 0, localHeaderLen+len(name)+zip64ExtraLen(off, size)+4+int(pad))
	b = le.AppendUint32(b, sigLocal)
	b = le.AppendUint16(b, versionFor(off, size))
	b = le.AppendUint16(b, flagsFor(size))
	b = le.AppendUint16(b, 0) // method: stored
	b = le.AppendUint16(b, 0) // time
	b = le.AppendUint16(b, 0) // date
	b = le.AppendUint32(b, 0) // CRC: in the descriptor
	var sz uint32
	if size >= max32 {
		sz = max32
	}
	b = le.AppendUint32(b, sz) // compressed size: in the descriptor
	b = le.AppendUint32(b, sz) // uncompressed size: in the descriptor
	b = le.AppendUint16(b, uint16(len(name)))
	b = le.AppendUint16(b, uint16(zip64ExtraLen(off, size)+4+int(pad)))
	b = append(b, name...)
	if size >= max32 || off >= max32 {
		b = appendZip64Extra(b, off, size)
	}
	b = le.AppendUint16(b, extraPad)
	b = le.AppendUint16(b, uint16(pad))
	for range pad {
		b = append(b, 'Z')
	}
	return b
}

// descriptor encodes a record's data descriptor.
func descriptor(off, size int64, crc uint32) []byte {
	le := binary.LittleEndian
	switch descriptorLen(off, size) {
	case 0:
		return nil
	case 24:
		b := le.AppendUint32(nil, sigDescriptor)
		b = le.AppendUint32(b, crc)
		b = le.AppendUint64(b, uint64(size))
		return le.AppendUint64(b, uint64(size))
	}
	b := le.AppendUint32(nil, sigDescriptor)
	b = le.AppendUint32(b, crc)
	b = le.AppendUint32(b, uint32(size))
	return le.AppendUint32(b, uint32(size))
}

// centralEntry encodes a record's central directory entry. Fields that
// have no meaning here (made-by, time, date, attributes) are zero, as
// miniz writes them; the reader checks that files we wrote keep them so.
func centralEntry(b []byte, name string, off, size int64, crc uint32) []byte {
	le := binary.LittleEndian
	b = le.AppendUint32(b, sigCentral)
	b = le.AppendUint16(b, 0) // made by
	b = le.AppendUint16(b, versionFor(off, size))
	b = le.AppendUint16(b, flagsFor(size))
	b = le.AppendUint16(b, 0) // method
	b = le.AppendUint16(b, 0) // time
	b = le.AppendUint16(b, 0) // date
	b = le.AppendUint32(b, crc)
	b = le.AppendUint32(b, clamp32(size))
	b = le.AppendUint32(b, clamp32(size))
	b = le.AppendUint16(b, uint16(len(name)))
	b = le.AppendUint16(b, uint16(zip64ExtraLen(off, size)))
	b = le.AppendUint16(b, 0) // comment length
	b = le.AppendUint16(b, 0) // disk number
	b = le.AppendUint16(b, 0) // internal attributes
	b = le.AppendUint32(b, 0) // external attributes
	b = le.AppendUint32(b, clamp32(off))
	b = append(b, name...)
	return appendZip64Extra(b, off, size)
}

// endRecords encodes the zip64 end record, its locator and the end record
// for a central directory of n entries, cdSize bytes at cdOff; the end
// record's comment is appended by the caller.
func endRecords(n int, cdOff, cdSize int64, commentLen int) []byte {
	le := binary.LittleEndian
	end64 := cdOff + cdSize
	b := le.AppendUint32(nil, sigEnd64)
	b = le.AppendUint64(b, end64Len-12)
	b = le.AppendUint16(b, versionZip64) // made by
	b = le.AppendUint16(b, versionZip64) // needed
	b = le.AppendUint32(b, 0)            // this disk
	b = le.AppendUint32(b, 0)            // disk with the central directory
	b = le.AppendUint64(b, uint64(n))
	b = le.AppendUint64(b, uint64(n))
	b = le.AppendUint64(b, uint64(cdSize))
	b = le.AppendUint64(b, uint64(cdOff))

	b = le.AppendUint32(b, sigLocator64)
	b = le.AppendUint32(b, 0)
	b = le.AppendUint64(b, uint64(end64))
	b = le.AppendUint32(b, 1) // total disks

	entries := uint16(max16)
	if n < max16 {
		entries = uint16(n)
	}
	b = le.AppendUint32(b, sigEnd)
	b = le.AppendUint16(b, 0)
	b = le.AppendUint16(b, 0)
	b = le.AppendUint16(b, entries)
	b = le.AppendUint16(b, entries)
	b = le.AppendUint32(b, clamp32(cdSize))
	b = le.AppendUint32(b, clamp32(cdOff))
	return le.AppendUint16(b, uint16(commentLen))
}
