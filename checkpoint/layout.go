// Package checkpoint writes and reads checkpoints in PyTorch's own zip
// format (the layout torch.save produces), with every storage record stored
// uncompressed and aligned for O_DIRECT, its CRC-32 computed alongside the
// writes and checked on reads, and saves committed durably.
//
// It knows byte records and engines, not tensors: Python pickles the object
// and names its storages (pyfastensor/checkpoint); TorchRecords lays out
// torch's records around them, the storages' alignment decided here.
package checkpoint

import "github.com/pyfastensor/pyfastensor/transfer"

// Alignment of record data in the file.
const (
	// DataAlign aligns storage records ("archive/data/<key>"), so O_DIRECT
	// and GPUDirect Storage can read them in place: transfer.Alignment.
	// Written to the file's ".storage_alignment" record (TorchRecords).
	DataAlign = transfer.Alignment
	// MetaAlign aligns every other record, as torch does.
	MetaAlign = 64
)

// Record is one entry of an archive to write.
type Record struct {
	// Name is the full name in the zip, e.g. "archive/data/0".
	Name string
	// Data is the record's bytes. It is only read during Save and never
	// retained.
	Data []byte
	// Align is the alignment of the data in the file (a power of two);
	// 0 means MetaAlign.
	Align int64
}

// placed is a record with its position in the file.
type placed struct {
	Record
	hdrOff  int64 // local header
	pad     int64 // padding bytes in the "FB" extra field
	dataOff int64 // first data byte
	descOff int64 // data descriptor (== dataOff+size)
	end     int64 // first byte after the descriptor
	crc     uint32
}

func (p *placed) size() int64 { return int64(len(p.Data)) }

// layout is where everything goes in the file.
type layout struct {
	recs   []placed
	cdOff  int64 // central directory
	cdSize int64
	total  int64 // file length
	noCRC  bool  // WriteOptions.NoCRC
}

// cdComment is the end record's comment in files we write: it carries the
// CRC-32 of the central directory and end records, so a flipped byte there
// is caught too. Fixed length: "pyfastensor cdcrc32=" + 8 hex digits.
const cdCommentPrefix = "pyfastensor cdcrc32="
const cdCommentLen = len(cdCommentPrefix) + 8

// endTotalLen is the length of the zip64 end record, its locator and the
// end record, without the comment.
const endTotalLen = end64Len + locator64Len + endLen

// plan lays records out in order, each record's data on its alignment.
func plan(recs []Record) layout {
	l := layout{recs: make([]placed, len(recs))}
	off := int64(0)
	for i, r := range recs {
		align := r.Align
		if align <= 0 {
			align = MetaAlign
		}
		size := int64(len(r.Data))
		pad := paddingLen(off, len(r.Name), size, align)
		p := placed{Record: r, hdrOff: off, pad: pad}
		p.dataOff = off + localHeaderLen + int64(len(r.Name)) + int64(zip64ExtraLen(off, size)) + 4 + pad
		p.descOff = p.dataOff + size
		p.end = p.descOff + descriptorLen(off, size)
		l.recs[i] = p
		off = p.end
	}
	l.cdOff = off
	for _, p := range l.recs {
		l.cdSize += centralLen + int64(len(p.Name)) + int64(zip64ExtraLen(p.hdrOff, p.size()))
	}
	l.total = l.cdOff + l.cdSize + endTotalLen + int64(cdCommentLen)
	return l
}
