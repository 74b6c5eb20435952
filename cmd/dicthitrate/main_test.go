package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/transfer/dict/hitrate"
)

func TestRunPrintsTheReportAsJSON(t *testing.T) {
	var out bytes.Buffer
	err := run([]string{"-dir", t.TempDir(), "-sizes", "3", "-max-size", "65536", "-iterations", "3",
		"-repeat", "1", "-write", "posix,direct", "-read", "posix,mmap"}, &out)
	require.NoError(t, err)
	var rep hitrate.Report
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	assert.Equal(t, 9, rep.Transfers)
	assert.Equal(t, []string{"posix", "direct"}, rep.Write)
	assert.Equal(t, []string{"posix", "mmap"}, rep.Read)
	assert.NotEmpty(t, rep.Results)
	assert.Contains(t, out.String(), `"hit_rate"`)
}

func TestRunRejectsStrayArgumentsAndBadEngines(t *testing.T) {
	var out bytes.Buffer
	assert.ErrorContains(t, run([]string{"-dir", t.TempDir(), "extra"}, &out), "unexpected arguments")
	assert.ErrorIs(t, run([]string{"-h"}, &out), flag.ErrHelp)
	err := run([]string{"-dir", t.TempDir(), "-write", "mmap", "-read", "posix"}, &out)
	assert.ErrorContains(t, err, "mmap cannot write")
	assert.Empty(t, out.String())
}
