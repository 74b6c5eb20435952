package main

/*
#include <stddef.h>
*/
import "C"

import (
	"encoding/json"
	"runtime"

	"github.com/klauspost/cpuid/v2"
	"github.com/pyfastensor/pyfastensor/gds"
)

// pft_info returns, as JSON, what the library knows of this machine and of
// the filesystem holding dir: versions, CPU features, and each engine's
// availability with the reason when it is not available. cufileLib, when
// not NULL, is the libcufile path to probe.
//
//export pft_info
func pft_info(dir, cufileLib *C.char, out **C.char, errbuf *C.char, errlen C.size_t) C.int {
	return call(errbuf, errlen, func() error {
		opts := gds.Options{}
		if cufileLib != nil {
			opts.CuFileLibrary = C.GoString(cufileLib)
		}
		b, err := json.Marshal(collectInfo(C.GoString(dir), opts))
		if err != nil {
			return err
		}
		*out = cstring(string(b))
		return nil
	})
}

type engineInfo struct {
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
}

func collectInfo(dir string, opts gds.Options) map[string]any {
	engines := map[string]engineInfo{}
	for _, name := range gds.Names() {
		_, err := gds.New(name, opts)
		if err != nil {
			engines[name] = engineInfo{Available: false, Reason: err.Error()}
		} else {
			engines[name] = engineInfo{Available: true}
		}
	}
	info := map[string]any{
		"version":    version,
		"go_version": runtime.Version(),
		"goos":       runtime.GOOS,
		"goarch":     runtime.GOARCH,
		"num_cpu":    runtime.NumCPU(),
		"cpu": map[string]any{
			"brand":   cpuid.CPU.BrandName,
			"vendor":  cpuid.CPU.VendorString,
			"cores":   cpuid.CPU.PhysicalCores,
			"threads": cpuid.CPU.LogicalCores,
			// The features that speed the data path: SIMD copies, CRC-32 by
			// carry-less multiply.
			"features": cpuFeatures(),
		},
		"engines": engines,
	}
	if dir != "" {
		info["dir"] = gds.ProbeDir(dir)
	}
	return info
}

func cpuFeatures() []string {
	var out []string
	for _, f := range []cpuid.FeatureID{cpuid.SSE42, cpuid.AVX, cpuid.AVX2, cpuid.AVX512F, cpuid.AVX512BW, cpuid.CLMUL, cpuid.VPCLMULQDQ, cpuid.ERMS, cpuid.FSRM, cpuid.ASIMD, cpuid.CRC32, cpuid.PMULL} {
		if cpuid.CPU.Supports(f) {
			out = append(out, f.String())
		}
	}
	return out
}
