package main

/*
#include <stddef.h>
*/
import "C"

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/offload"
)

// G10 (offload/trace.go, simulate.go, plan.go) behind pyfastensor.plan.
// Traces and hardware cross as JSON (trace schema version 1,
// offload.Hardware), results come back as JSON to be freed with pft_free.
// Every call parses and validates its trace again: the rules live once, in
// offload.ParseTrace, and Python keeps no trace state in Go.

// planDefaults is what Python reads instead of writing it down again.
type planDefaults struct {
	TraceVersion int              `json:"trace_version"`
	Kinds        []string         `json:"kinds"`
	Policies     []string         `json:"policies"`
	Tiers        []string         `json:"tiers"`
	Hardware     offload.Hardware `json:"hardware"`
	Artifact     offload.Hardware `json:"hardware_artifact"`
}

// planMade is a migration plan with its printable table.
type planMade struct {
	offload.MigrationPlan
	Table string `json:"table"`
}

func defaults() planDefaults {
	return planDefaults{TraceVersion: offload.TraceVersion, Kinds: offload.TraceKinds,
		Policies: offload.Policies, Tiers: []string{offload.TierSSD, offload.TierHost},
		Hardware: offload.G10Default(), Artifact: offload.G10Artifact()}
}

// normalTrace returns t as JSON with every list present (empty, not null).
func normalTrace(t *offload.Trace) ([]byte, error) {
	if t.Tensors == nil {
		t.Tensors = []offload.TraceTensor{}
	}
	if t.Ops == nil {
		t.Ops = []offload.TraceOp{}
	}
	for i := range t.Ops {
		if t.Ops[i].Reads == nil {
			t.Ops[i].Reads = []int{}
		}
		if t.Ops[i].Writes == nil {
			t.Ops[i].Writes = []int{}
		}
	}
	b, err := t.Marshal()
	if err != nil {
		return nil, fmt.Errorf("encoding the trace: %w", err)
	}
	return b, nil
}

// parseHardware decodes hardware JSON strictly: a misspelt field is an
// error, not a zero.
func parseHardware(data []byte) (offload.Hardware, error) {
	var hw offload.Hardware
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&hw); err != nil {
		return hw, fmt.Errorf("%w: decoding hardware JSON: %w", offload.ErrHardware, err)
	}
	return hw, hw.Validate()
}

func planSimulate(traceJSON, hwJSON []byte, policy string) (offload.Result, error) {
	t, err := offload.ParseTrace(traceJSON)
	if err != nil {
		return offload.Result{}, err
	}
	hw, err := parseHardware(hwJSON)
	if err != nil {
		return offload.Result{}, err
	}
	r, err := offload.SimulatePolicy(t, hw, policy)
	if err != nil {
		return r, fmt.Errorf("simulating policy %q: %w", policy, err)
	}
	return r, nil
}

func planMake(traceJSON, hwJSON []byte) (planMade, error) {
	t, err := offload.ParseTrace(traceJSON)
	if err != nil {
		return planMade{}, err
	}
	hw, err := parseHardware(hwJSON)
	if err != nil {
		return planMade{}, err
	}
	p, err := offload.MakePlan(t, hw)
	if err != nil {
		return planMade{}, fmt.Errorf("making the G10 plan: %w", err)
	}
	if p.Migrations == nil {
		p.Migrations = []offload.Migration{}
	}
	return planMade{MigrationPlan: p, Table: p.String()}, nil
}

// cbytes is the caller's NUL-terminated argument s, which must not be NULL.
func cbytes(s *C.char, what string) ([]byte, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: %s is NULL", gds.ErrInvalid, what)
	}
	return []byte(C.GoString(s)), nil
}

// pft_plan_defaults returns, as JSON, the trace schema version, the tensor
// kinds, the policies pft_plan_simulate knows, the tiers, the G10 paper's
// Table 2 hardware (offload.G10Default) and the G10 artifact's
// (offload.G10Artifact).
//
//export pft_plan_defaults
func pft_plan_defaults(out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		return putJSON(out, defaults())
	})
}

// pft_plan_parse_trace validates a trace given as JSON (offload.ParseTrace)
// and returns it normalized (every list present, unknown fields dropped).
// An invalid trace is an invalid argument naming the op or tensor at fault.
//
//export pft_plan_parse_trace
func pft_plan_parse_trace(trace *C.char, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		data, err := cbytes(trace, "trace")
		if err != nil {
			return err
		}
		t, err := offload.ParseTrace(data)
		if err != nil {
			return err
		}
		b, err := normalTrace(t)
		if err != nil {
			return err
		}
		*out = cstring(string(b))
		return nil
	})
}

// pft_plan_read_trace reads the trace file at path (offload.ReadTrace) and
// returns it as pft_plan_parse_trace does. A file that holds no valid trace
// is corrupt, and the message names the path.
//
//export pft_plan_read_trace
func pft_plan_read_trace(path *C.char, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		p, err := cbytes(path, "path")
		if err != nil {
			return err
		}
		t, err := offload.ReadTrace(string(p))
		if err != nil {
			return err
		}
		b, err := normalTrace(t)
		if err != nil {
			return err
		}
		*out = cstring(string(b))
		return nil
	})
}

// pft_plan_simulate replays a trace on hardware (both JSON) under policy
// (offload.SimulatePolicy) and returns the offload.Result as JSON. A trace
// the policy cannot fit gives Feasible false and the reason, not an error.
//
//export pft_plan_simulate
func pft_plan_simulate(trace, hardware, policy *C.char, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		t, err := cbytes(trace, "trace")
		if err != nil {
			return err
		}
		hw, err := cbytes(hardware, "hardware")
		if err != nil {
			return err
		}
		pol, err := cbytes(policy, "policy")
		if err != nil {
			return err
		}
		r, err := planSimulate(t, hw, string(pol))
		if err != nil {
			return err
		}
		return putJSON(out, r)
	})
}

// pft_plan_make runs G10's planner (offload.MakePlan) over a trace for
// hardware (both JSON) and returns the offload.MigrationPlan as JSON with
// its printable table ("table"). A trace one op of which does not fit the
// device is an invalid argument naming the op and the capacity.
//
//export pft_plan_make
func pft_plan_make(trace, hardware *C.char, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		t, err := cbytes(trace, "trace")
		if err != nil {
			return err
		}
		hw, err := cbytes(hardware, "hardware")
		if err != nil {
			return err
		}
		p, err := planMake(t, hw)
		if err != nil {
			return err
		}
		return putJSON(out, p)
	})
}

// pft_plan_bound returns, as JSON {"bound_ns": N}, a lower bound on the
// simulated time of one iteration of a trace on hardware (both JSON) under
// any policy (offload.BoundNs): what the bytes that must cross the links
// cost. 0 when one op alone does not fit the device.
//
//export pft_plan_bound
func pft_plan_bound(trace, hardware *C.char, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		tj, err := cbytes(trace, "trace")
		if err != nil {
			return err
		}
		hj, err := cbytes(hardware, "hardware")
		if err != nil {
			return err
		}
		t, err := offload.ParseTrace(tj)
		if err != nil {
			return err
		}
		hw, err := parseHardware(hj)
		if err != nil {
			return err
		}
		return putJSON(out, map[string]int64{"bound_ns": offload.BoundNs(t, hw)})
	})
}

// pft_plan_mix decides, for a profiled step (JSON, offload.MixInput), each
// saved tensor's action: kept, moved to a tier, or recomputed in backward
// (offload.PlanMix). out: the plan as JSON (offload.MixPlan), with the
// whole frontier. A budget below any mix is an error naming the smallest
// feasible one.
//
//export pft_plan_mix
func pft_plan_mix(input *C.char, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		var in offload.MixInput
		if err := parseJSON(input, &in); err != nil {
			return err
		}
		p, err := offload.PlanMix(&in)
		if err != nil {
			return err
		}
		return putJSON(out, p)
	})
}
