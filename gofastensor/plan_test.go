package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/offload"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The plan calls' Go halves (the exports add only call's shape around
// them; cgo is not allowed in tests).

const abiTrace = `{"version": 1, "extra": true,
 "tensors": [{"id": 0, "bytes": 4096, "kind": "weight"}, {"id": 3, "bytes": 100, "kind": "input"},
             {"id": 4, "bytes": 800, "kind": "activation"}, {"id": 5, "bytes": 800, "kind": "gradient"}],
 "ops": [{"name": "fwd", "time_ns": 12000, "reads": [0, 3], "writes": [4]},
         {"name": "loss", "time_ns": 1000},
         {"name": "bwd", "time_ns": 20000, "reads": [4, 0], "writes": [5]}]}`

func hwJSON(t *testing.T, device int64) []byte {
	hw := offload.G10Default()
	hw.DeviceBytes = device
	b, err := json.Marshal(hw)
	require.NoError(t, err)
	return b
}

func TestNormalTraceListsEveryListAndDropsUnknownFields(t *testing.T) {
	tr, err := offload.ParseTrace([]byte(abiTrace))
	require.NoError(t, err)
	b, err := normalTrace(tr)
	require.NoError(t, err)
	assert.NotContains(t, string(b), "extra")
	assert.NotContains(t, string(b), "null")
	assert.Contains(t, string(b), `"name":"loss","time_ns":1000,"reads":[],"writes":[]`)
}

func TestParseHardwareIsStrict(t *testing.T) {
	hw, err := parseHardware(hwJSON(t, 1<<20))
	require.NoError(t, err)
	assert.Equal(t, int64(1<<20), hw.DeviceBytes)
	_, err = parseHardware([]byte(`{"device_byte": 5}`))
	assert.ErrorIs(t, err, gds.ErrInvalid)
	assert.Contains(t, err.Error(), "device_byte")
	_, err = parseHardware([]byte(`{"device_bytes": 5}`))
	assert.ErrorIs(t, err, offload.ErrHardware)
}

func TestPlanSimulate(t *testing.T) {
	r, err := planSimulate([]byte(abiTrace), hwJSON(t, 1<<30), offload.PolicyIdeal)
	require.NoError(t, err)
	assert.Equal(t, int64(33000), r.TimeNs)
	assert.True(t, r.Feasible)
	_, err = planSimulate([]byte(abiTrace), hwJSON(t, 1<<30), "nope")
	assert.ErrorIs(t, err, gds.ErrInvalid)
	assert.Contains(t, err.Error(), `simulating policy "nope"`)
	_, err = planSimulate([]byte(`{"version": 1, "tensors": [], "ops": [{"name": "a", "time_ns": 1, "reads": [9]}]}`), hwJSON(t, 1<<30), "g10")
	assert.ErrorIs(t, err, offload.ErrTrace)
	assert.Equal(t, stInvalid, int(statusOf(err)))
}

func TestPlanMake(t *testing.T) {
	p, err := planMake([]byte(abiTrace), hwJSON(t, 1<<30))
	require.NoError(t, err)
	assert.Empty(t, p.Migrations)
	assert.NotNil(t, p.Migrations) // crosses as [], not null
	assert.Contains(t, p.Table, "0 migrations")

	p, err = planMake([]byte(abiTrace), hwJSON(t, 5700))
	require.NoError(t, err)
	assert.LessOrEqual(t, p.PeakBytes, int64(5700))
	assert.NotEmpty(t, p.Migrations)
	assert.Equal(t, p.String(), p.Table)

	_, err = planMake([]byte(abiTrace), hwJSON(t, 1000))
	assert.ErrorIs(t, err, offload.ErrInfeasible)
	assert.Contains(t, err.Error(), "capacity of 1000 bytes")
	assert.Equal(t, stInvalid, int(statusOf(err)))
}

func TestPlanDefaultsAreOffloads(t *testing.T) {
	d := defaults()
	assert.Equal(t, offload.G10Default(), d.Hardware)
	assert.Equal(t, offload.G10Artifact(), d.Artifact)
	assert.Equal(t, offload.Policies, d.Policies)
	assert.Equal(t, offload.TraceKinds, d.Kinds)
}

func TestReadTraceStatus(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"version": 1, "tensors": [{"id": 1}]}`), 0o644))
	_, err := offload.ReadTrace(path)
	require.Error(t, err)
	assert.Equal(t, stCorrupt, int(statusOf(err)))
	assert.Contains(t, err.Error(), path)
	_, err = offload.ReadTrace(path + ".missing")
	assert.Equal(t, stNotFound, int(statusOf(err)))
}
