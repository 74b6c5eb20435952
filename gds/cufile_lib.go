package gds

import (
	"os"
	"slices"
	"sync"
)

// cufileLibEnv names the environment variable with the libcufile to load.
const cufileLibEnv = "PYFASTENSOR_CUFILE_LIB"

// cufileDefaultLib is what the dynamic loader is asked for by default.
const cufileDefaultLib = "libcufile.so.0"

// cufileCandidates are libcufile paths found by the Python package (the
// copies torch's CUDA wheels install under site-packages), set once when
// the library is loaded (SetCuFileCandidates).
var cufileCandidates struct {
	sync.Mutex
	paths []string
}

// SetCuFileCandidates records the libcufile paths to try after
// Options.CuFileLibrary and $PYFASTENSOR_CUFILE_LIB, before the dynamic
// loader's search. Paths that do not exist are skipped at resolution.
func SetCuFileCandidates(paths []string) {
	cufileCandidates.Lock()
	cufileCandidates.paths = slices.Clone(paths)
	cufileCandidates.Unlock()
}

// CuFileLibrary is the one resolution of the libcufile to load, the same
// for info(), checkpoints, the spill store and raw files: Options.
// CuFileLibrary, else $PYFASTENSOR_CUFILE_LIB, else the first existing
// candidate (SetCuFileCandidates), else the soname libcufile.so.0 for the
// loader's search. It returns the library and where it came from
// ("option", "environment", "candidate" or "loader").
func CuFileLibrary(o Options) (lib, source string) {
	if o.CuFileLibrary != "" {
		return o.CuFileLibrary, "option"
	}
	if v := os.Getenv(cufileLibEnv); v != "" {
		return v, "environment"
	}
	cufileCandidates.Lock()
	defer cufileCandidates.Unlock()
	for _, p := range cufileCandidates.paths {
		if _, err := os.Stat(p); err == nil {
			return p, "candidate"
		}
	}
	return cufileDefaultLib, "loader"
}

func cufileLibrary(o Options) string {
	lib, _ := CuFileLibrary(o)
	return lib
}
