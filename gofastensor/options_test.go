package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Options omitted are the defaults (durable, verified, CRC-32s written); every field crosses
// by its JSON name; an unknown or malformed one is refused, naming it.
func TestOptionsDecode(t *testing.T) {
	o, err := decodeOptions("")
	require.NoError(t, err)
	assert.Equal(t, ioOptions{Durable: true, Verify: true, CRC32: true}, o)

	o, err = decodeOptions(`{"engine": "direct", "threads": 3, "task_size": 1048576, "queue_depth": 8,
		"workers": 2, "durable": false, "verify": false, "crc32": false, "dict": 7, "dict_use": 1,
		"cufile_library": "/x.so"}`)
	require.NoError(t, err)
	assert.Equal(t, ioOptions{Engine: "direct", Threads: 3, TaskSize: 1 << 20, QueueDepth: 8, Workers: 2,
		Dict: 7, DictUse: 1, CufileLibrary: "/x.so"}, o)
	w0, err := ioOptions{Durable: true}.write(nil)
	require.NoError(t, err)
	assert.True(t, w0.NoCRC, "crc32 false: the save writes no CRC-32")
	w0, err = ioOptions{Durable: true, CRC32: true}.write(nil)
	require.NoError(t, err)
	assert.False(t, w0.NoCRC)
	assert.Equal(t, gds.Options{Threads: 3, TaskSize: 1 << 20, QueueDepth: 8, CuFileLibrary: "/x.so"}, o.engine())

	w, err := ioOptions{Durable: true, Engine: "posix"}.write(nil)
	require.NoError(t, err)
	assert.False(t, w.NotDurable)
	assert.NotNil(t, w.Chooser)
	r, err := ioOptions{}.read(nil)
	require.NoError(t, err)
	assert.True(t, r.NoVerify)
	assert.Nil(t, r.Chooser, "no engine, no dictionaries: the default choice")

	_, err = decodeOptions(`{"engnie": "direct"}`)
	require.ErrorIs(t, err, gds.ErrInvalid)
	assert.Contains(t, err.Error(), "engnie")
	_, err = decodeOptions(`{"threads": "four"}`)
	require.ErrorIs(t, err, gds.ErrInvalid)
	assert.Contains(t, err.Error(), "threads")
	for opt, msg := range map[string]string{
		`{"threads": -1}`:      "threads=-1: expected 0 (the default) to 1024",
		`{"threads": 1000000}`: "threads=1000000",
		`{"task_size": 1}`:     "task_size=1: expected 0 (the default) or at least 4096 bytes",
		`{"task_size": -5}`:    "task_size=-5",
		`{"queue_depth": -1}`:  "queue_depth=-1",
		`{"workers": -2}`:      "workers=-2",
	} {
		_, err = decodeOptions(opt)
		require.ErrorIs(t, err, gds.ErrInvalid, opt)
		assert.ErrorContains(t, err, msg, opt)
	}
	_, err = decodeOptions(`{} {}`)
	require.ErrorIs(t, err, gds.ErrInvalid)
	assert.Contains(t, err.Error(), "more than one JSON value")

	_, err = ioOptions{Dict: 123456789}.read(nil)
	require.ErrorIs(t, err, errBadHandle, "a dictionary handle that is not open")
}
