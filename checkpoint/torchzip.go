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
	if t.Prefix == "" {
		return nil, fmt.Errorf("%w: torch archive without a record prefix", gds.ErrInvalid)
	}
	p := t.Prefix + "/"
	recs := make([]Record, 0, len(t.Storages)+6)
	recs = append(recs,
		Record{Name: p + "data.pkl", Data: t.Pickle},
		Record{Name: p + ".format_version", Data: []byte("1")},
		Record{Name: p + ".storage_alignment", Data: []byte(strconv.Itoa(DataAlign))})
	if t.ByteOrder != "" {
		recs = append(recs, Record{Name: p + "byteorder", Data: []byte(t.ByteOrder)})
	}
	for _, s := range t.Storages {
		recs = append(recs, Record{Name: p + "data/" + s.Key, Data: s.Data, Align: DataAlign})
	}
	return append(recs,
		Record{Name: p + "version", Data: []byte("3\n")},
		Record{Name: p + ".data/serialization_id", Data: []byte(t.SerializationID)}), nil
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
