package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"time"

	"github.com/klauspost/cpuid/v2"
	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// pft_info returns, as JSON, what the library knows of this machine and of
// the filesystem holding dir: versions, CPU features, each engine's
// availability with the reason when it is not available (cufile's for
// dir's filesystem: see transfer.DirProbe), the directory's
// probe (transfer.Probe: the same one every engine choice uses, with the
// libcufile actually loaded) and the data path's thresholds. cufileLib,
// when not NULL, is a libcufile path to probe instead of the one resolved.
//
//export pft_info
func pft_info(dir, cufileLib *C.char, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		opts := gds.Options{}
		if cufileLib != nil {
			opts.CuFileLibrary = C.GoString(cufileLib)
		}
		return putJSON(out, collectInfo(C.GoString(dir), opts))
	})
}

// pft_configure applies process-wide settings the Python package found,
// given as JSON: {"cufile_candidates": [paths]} (the libcufile copies that
// torch's CUDA wheels install; gds.CuFileLibrary tries them after
// $PYFASTENSOR_CUFILE_LIB). Called once, when the library is loaded.
//
//export pft_configure
func pft_configure(config *C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		var c struct {
			CuFileCandidates []string `json:"cufile_candidates"`
		}
		if err := parseJSON(config, &c); err != nil {
			return err
		}
		gds.SetCuFileCandidates(c.CuFileCandidates)
		return nil
	})
}

// pft_settings returns the data path's thresholds (transfer.Settings) as
// JSON: the Python side reads them here rather than writing them down
// again. overrides, when not NULL, is a JSON object of settings to change
// first (tests only: transfer.Override).
//
//export pft_settings
func pft_settings(overrides *C.char, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		var o map[string]int64
		if err := parseJSON(overrides, &o); err != nil {
			return err
		}
		if len(o) > 0 {
			if _, err := transfer.Override(o); err != nil {
				return err
			}
		}
		return putJSON(out, transfer.Settings())
	})
}

// pft_crc_speed measures the CRC-32 every record is checked with, on one
// thread, for about millis milliseconds (transfer.CRCSpeed): *out is bytes
// per second over a block of block bytes summed again and again.
//
//export pft_crc_speed
func pft_crc_speed(block C.int64_t, millis C.int, out *C.double, errOut **C.char) C.int {
	return call(errOut, func() error {
		if block <= 0 || block > 1<<32 || millis <= 0 {
			return fmt.Errorf("%w: crc speed: block %d bytes, %d ms: both must be positive", gds.ErrInvalid, block, millis)
		}
		*out = C.double(transfer.CRCSpeed(int(block), time.Duration(millis)*time.Millisecond))
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
		p := transfer.Probe(dir)
		info["dir"] = p
		// cufile is available only where it moves bytes: on dir's filesystem.
		if e := engines["cufile"]; e.Available && !p.CuFile {
			engines["cufile"] = engineInfo{Reason: fmt.Sprintf("%v: cufile: %s", gds.ErrUnavailable, p.CuFileReason)}
		}
	}
	info["settings"] = transfer.Settings()
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
