package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"encoding/json"
	"fmt"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/offload"
)

// pft_offload_plan runs the FlashNeuron scheduler over a profile given as
// JSON (offload.Profile) and returns the plan as JSON (offload.Plan, with
// its printable text), to be freed with pft_free.
//
//export pft_offload_plan
func pft_offload_plan(profile *C.char, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		var p offload.Profile
		if err := json.Unmarshal([]byte(C.GoString(profile)), &p); err != nil {
			return fmt.Errorf("%w: offload profile: %w", gds.ErrInvalid, err)
		}
		return putJSON(out, offload.Schedule(p))
	})
}
