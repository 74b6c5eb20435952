package checkpoint

import (
	"bytes"
	"encoding/binary"
)

// truncated explains a file with no end record. The usual cause is a file
// cut short, which loses the central directory first, so the records are
// walked from the start through their local headers to name the one the
// cut went through. A record with a data descriptor does not state its
// size up front: its end is found by searching for a descriptor whose size
// matches its distance from the data's start.
func (p *parser) truncated() error {
	var off int64
	last := ""
	for off < p.size {
		if off+localHeaderLen > p.size {
			return p.cut(last, off, "a local header")
		}
		lh, err := p.read(off, localHeaderLen, last, "local header")
		if err != nil {
			return err
		}
		if le.Uint32(lh) != sigLocal {
			if le.Uint32(lh) == sigCentral {
				return p.cut(last, off, "the central directory")
			}
			return corrupt(p.path, last, off, "no end of central directory record, and no record header where one should follow (not a zip file, or damaged)")
		}
		nameLen, extraLen := int64(le.Uint16(lh[26:])), int64(le.Uint16(lh[28:]))
		name := ""
		if off+localHeaderLen+nameLen <= p.size {
			b, _ := p.read(off+localHeaderLen, nameLen, last, "name")
			name = string(b)
		}
		data := off + localHeaderLen + nameLen + extraLen
		if data > p.size {
			return p.cut(name, off, "its local header")
		}
		if le.Uint16(lh[6:])&flagDescriptor == 0 {
			end := data + int64(le.Uint32(lh[18:]))
			if end > p.size {
				return p.cut(name, data, "its data")
			}
			off, last = end, name
			continue
		}
		end, ok := p.findDescriptor(data)
		if !ok {
			return p.cut(name, data, "its data")
		}
		off, last = end, name
	}
	return p.cut(last, off, "the central directory")
}

// cut reports a file that ends inside record (or, once all records are
// complete, inside what follows them).
func (p *parser) cut(record string, off int64, inside string) error {
	return corrupt(p.path, record, off, "file is truncated (%d bytes): it ends inside %s; the central directory is missing", p.size, inside)
}

// findDescriptor searches from data for a data descriptor whose size field
// equals its distance from data, and returns the offset after it.
func (p *parser) findDescriptor(data int64) (int64, bool) {
	const chunk = 4 << 20
	sig := binary.LittleEndian.AppendUint32(nil, sigDescriptor)
	for pos := data; pos < p.size; pos += chunk - 24 {
		b, err := p.read(pos, min(chunk, p.size-pos), "", "data")
		if err != nil {
			return 0, false
		}
		for i := 0; ; {
			j := bytes.Index(b[i:], sig)
			if j < 0 {
				break
			}
			at := i + j
			size := pos + int64(at) - data
			if at+16 <= len(b) && int64(le.Uint32(b[at+8:])) == size && int64(le.Uint32(b[at+12:])) == size {
				return pos + int64(at) + 16, true
			}
			if at+24 <= len(b) && int64(le.Uint64(b[at+8:])) == size {
				return pos + int64(at) + 24, true
			}
			i = at + 1
		}
		if pos+int64(len(b)) >= p.size {
			break
		}
	}
	return 0, false
}
