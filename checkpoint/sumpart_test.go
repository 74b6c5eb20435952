package checkpoint

import (
	"testing"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// SumPart over a record's bytes in memory, part after part, agrees with
// its CRC-32, and catches a flipped byte at the last part.
func TestSumPartChecksRecordsInMemory(t *testing.T) {
	_, recs, a := openSample(t)
	const part = 3<<20 + 5
	var err error
	for i, r := range recs {
		var crc uint32
		for off := 0; off < len(r.Data); off += part {
			crc, err = a.SumPart(i, int64(off), r.Data[off:min(off+part, len(r.Data))], crc)
			require.NoError(t, err, r.Name)
		}
	}
	big := len(recs) - 2
	bad := append([]byte(nil), recs[big].Data...)
	bad[len(bad)-1] ^= 1
	_, err = a.SumPart(big, 0, bad, 0)
	assert.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorContains(t, err, recs[big].Name)
	_, err = a.SumPart(big, 1, bad, 0)
	assert.ErrorIs(t, err, gds.ErrInvalid, "a part past the record's end")
}
