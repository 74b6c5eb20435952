package checkpoint

import (
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/pyfastensor/pyfastensor/transfer"
)

func TestSaveTorchLaysOutTorchsRecordsWithItsAlignment(t *testing.T) {
	a, b := testutil.Pattern(5000, 1), testutil.Pattern(70, 2)
	archive := TorchArchive{Prefix: "archive", Pickle: []byte("pickle"), ByteOrder: "little",
		SerializationID: "0123", Storages: []TorchStorage{{Key: "0", Data: a}, {Key: "1", Data: b}, {Key: "2"}}}
	path := filepath.Join(t.TempDir(), "t.pt")
	_, err := SaveTorch(path, archive, WriteOptions{NotDurable: true})
	require.NoError(t, err)
	got, err := OpenArchive(path)
	require.NoError(t, err)
	defer got.Close()
	var names []string
	want := map[string][]byte{"archive/data.pkl": []byte("pickle"), "archive/.format_version": []byte("1"),
		"archive/.storage_alignment": []byte(strconv.Itoa(transfer.Alignment)), "archive/byteorder": []byte("little"),
		"archive/data/0": a, "archive/data/1": b, "archive/data/2": nil, "archive/version": []byte("3\n"),
		"archive/.data/serialization_id": []byte("0123")}
	for i, e := range got.Entries {
		names = append(names, e.Name)
		dst := make([]byte, e.Size)
		_, err := got.Read([]ReadRequest{{Index: i, Dst: dst}}, ReadOptions{})
		require.NoError(t, err)
		assert.Equal(t, string(want[e.Name]), string(dst), e.Name)
		if filepath.Dir(e.Name) == "archive/data" && e.Size > 0 {
			assert.Zero(t, e.DataOff%DataAlign, e.Name)
		}
	}
	assert.Equal(t, []string{"archive/data.pkl", "archive/.format_version", "archive/.storage_alignment",
		"archive/byteorder", "archive/data/0", "archive/data/1", "archive/data/2", "archive/version",
		"archive/.data/serialization_id"}, names)

	archive.ByteOrder = ""
	recs, err := TorchRecords(archive)
	require.NoError(t, err)
	assert.Len(t, recs, len(names)-1, "no byteorder record")
	_, err = TorchRecords(TorchArchive{})
	require.ErrorIs(t, err, gds.ErrInvalid)
}

func TestParseDecidesWhatTorchLoadReadsInstead(t *testing.T) {
	stored := func(names ...string) []Entry {
		es := make([]Entry, len(names))
		for i, n := range names {
			es[i] = Entry{Name: n}
		}
		return es
	}
	for _, c := range []struct {
		es       []Entry
		prefix   string
		fallback string
	}{
		{stored("archive/data.pkl", "archive/data/0"), "archive/", ""},
		{stored("model/data.pkl", "model/constants.pkl"), "model/", "a TorchScript archive"},
		{stored("data.pkl"), "", "not torch's layout: the first record is in no directory"},
		{nil, "", "no records"},
		{[]Entry{{Name: "a/data.pkl"}, {Name: "a/data/0", Method: 8}}, "a/", `record "a/data/0" is compressed`},
	} {
		prefix, fallback := torchLayout(c.es)
		assert.Equal(t, c.prefix, prefix)
		assert.Equal(t, c.fallback, fallback)
	}
	_, a := savedSample(t)
	assert.Equal(t, "archive/", a.Prefix)
	assert.Empty(t, a.Fallback)
}
