package checkpoint

import (
	"fmt"
	"strconv"

	"github.com/pyfastensor/pyfastensor/gds"
)

// TorchArchive is what torch.save puts in its zip: the pickled object, the
// records describing the file, and one record per storage the pickle
// refers to by key. TorchRecords lays it out as torch does, with the
// alignment of the storage records decided here (DataAlign) and written
// into ".storage_alignment".
type TorchArchive struct {
	// Prefix is the directory every record lives under ("archive").
	Prefix string
	// Pickle is data.pkl: the object, storages as persistent ids.
	Pickle []byte
	// ByteOrder is the "byteorder" record ("little" or "big"); "" writes
	// none (torch.save's _disable_byteorder_record).
	ByteOrder string
	// SerializationID is ".data/serialization_id".
	SerializationID string
	// Storages are the storage records "data/<Key>", in the pickle's order.
	Storages []TorchStorage
}

// TorchStorage is one storage's bytes, read during the save only.
type TorchStorage struct {
	Key  string
	Data []byte
}

// TorchRecords returns t's records in torch.save's order: data.pkl,
// .format_version, .storage_alignment, byteorder, the storages (aligned to
// DataAlign), version, .data/serialization_id.
func TorchRecords(t TorchArchive) ([]Record, error) {
	recs, _, err := torchRecords(t)
	return recs, err
}

// torchRecords is TorchRecords, with the index of the first storage record
// (the storages' records follow one another).
func torchRecords(t TorchArchive) (recs []Record, first int, err error) {
	if t.Prefix == "" {
		return nil, 0, fmt.Errorf("%w: torch archive without a record prefix", gds.ErrInvalid)
	}
	p := t.Prefix + "/"
	recs = make([]Record, 0, len(t.Storages)+6)
	recs = append(recs,
		Record{Name: p + "data.pkl", Data: t.Pickle},
		Record{Name: p + ".format_version", Data: []byte("1")},
		Record{Name: p + ".storage_alignment", Data: []byte(strconv.Itoa(DataAlign))})
	if t.ByteOrder != "" {
		recs = append(recs, Record{Name: p + "byteorder", Data: []byte(t.ByteOrder)})
	}
	first = len(recs)
	for _, s := range t.Storages {
		recs = append(recs, Record{Name: p + "data/" + s.Key, Data: s.Data, Align: DataAlign})
	}
	return append(recs,
		Record{Name: p + "version", Data: []byte("3\n")},
		Record{Name: p + ".data/serialization_id", Data: []byte(t.SerializationID)}), first, nil
}

// SaveTorch writes t as torch.save's zip archive at path (TorchRecords),
// committed as Save commits.
func SaveTorch(path string, t TorchArchive, o WriteOptions) (Stats, error) {
	recs, err := TorchRecords(t)
	if err != nil {
		return Stats{}, err
	}
	return Save(path, recs, o)
}

// TorchStaged is a staged save (Staged) of a torch archive, laid out as
// SaveTorch lays it out; its storages' parts are written by their place in
// TorchArchive.Storages (WriteStorage).
type TorchStaged struct {
	*Staged
	first, n int // record index of the first storage; storages
}

// BeginTorchStaged begins a staged save of t at path (BeginStaged). A
// storage with staged[k] set has sizes[k] bytes, written later by
// WriteStorage (its Data must be nil); every other storage's Data, and the
// pickle, are read at Commit, so the caller keeps them alive and unchanged
// until Commit or Abort returns.
func BeginTorchStaged(path string, t TorchArchive, staged []bool, sizes []int64, o WriteOptions) (*TorchStaged, error) {
	if len(staged) != len(t.Storages) || len(sizes) != len(t.Storages) {
		return nil, fmt.Errorf("%w: %d storages, %d staged flags, %d sizes", gds.ErrInvalid, len(t.Storages), len(staged), len(sizes))
	}
	recs, first, err := torchRecords(t)
	if err != nil {
		return nil, err
	}
	flags, lens := make([]bool, len(recs)), make([]int64, len(recs))
	for k := range t.Storages {
		flags[first+k], lens[first+k] = staged[k], sizes[k]
	}
	s, err := BeginStaged(path, recs, flags, lens, o)
	if err != nil {
		return nil, err
	}
	return &TorchStaged{Staged: s, first: first, n: len(t.Storages)}, nil
}

// WriteStorage writes p as the bytes of staged storage k from offset off
// of its data (WritePart).
func (s *TorchStaged) WriteStorage(k int, off int64, p []byte) error {
	return s.WriteStorages([]Part{{Rec: k, Off: off, Data: p}})
}

// WriteStorages writes parts of staged storages in one transfer
// (WriteParts); a part's Rec is the storage's index among t.Storages.
func (s *TorchStaged) WriteStorages(parts []Part) error {
	recs := make([]Part, len(parts))
	for j, p := range parts {
		if p.Rec < 0 || p.Rec >= s.n {
			return fmt.Errorf("%w: checkpoint: staged save %s: storage %d of %d", gds.ErrInvalid, s.path, p.Rec, s.n)
		}
		recs[j] = Part{Rec: s.first + p.Rec, Off: p.Off, Data: p.Data}
	}
	return s.WriteParts(recs)
}
