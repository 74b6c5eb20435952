package gds

import (
	"fmt"
)

// CuFileError is a failure status from libcufile: the CUfileOpError code
// and, for CU_FILE_CUDA_DRIVER_ERROR, the CUDA driver's CUresult.
type CuFileError struct {
	Call     string // the cuFile function, e.g. "cuFileRead"
	Code     int    // a CUfileOpError, 5001 and up
	CUResult int    // the CUresult; 0 unless Code is CU_FILE_CUDA_DRIVER_ERROR
}

func (e *CuFileError) Error() string {
	msg := fmt.Sprintf("%s: %s (%d)", e.Call, cuFileErrorName(e.Code), e.Code)
	if e.CUResult != 0 {
		msg += fmt.Sprintf(", CUresult %d", e.CUResult)
	}
	return msg
}

// cuFileOpErrBase is CUFILEOP_BASE_ERR: cuFile's own codes lie above it, so
// a negative transfer result of smaller magnitude is an errno.
const cuFileOpErrBase = 5000

// cuFileErrorNames are the CUfileOpError values of cufile.h.
var cuFileErrorNames = map[int]string{
	5001: "CU_FILE_DRIVER_NOT_INITIALIZED", 5002: "CU_FILE_DRIVER_INVALID_PROPS",
	5003: "CU_FILE_DRIVER_UNSUPPORTED_LIMIT", 5004: "CU_FILE_DRIVER_VERSION_MISMATCH",
	5005: "CU_FILE_DRIVER_VERSION_READ_ERROR", 5006: "CU_FILE_DRIVER_CLOSING",
	5007: "CU_FILE_PLATFORM_NOT_SUPPORTED", 5008: "CU_FILE_IO_NOT_SUPPORTED",
	5009: "CU_FILE_DEVICE_NOT_SUPPORTED", 5010: "CU_FILE_NVFS_DRIVER_ERROR",
	5011: "CU_FILE_CUDA_DRIVER_ERROR", 5012: "CU_FILE_CUDA_POINTER_INVALID",
	5013: "CU_FILE_CUDA_MEMORY_TYPE_INVALID", 5014: "CU_FILE_CUDA_POINTER_RANGE_ERROR",
	5015: "CU_FILE_CUDA_CONTEXT_MISMATCH", 5016: "CU_FILE_INVALID_MAPPING_SIZE",
	5017: "CU_FILE_INVALID_MAPPING_RANGE", 5018: "CU_FILE_INVALID_FILE_TYPE",
	5019: "CU_FILE_INVALID_FILE_OPEN_FLAG", 5020: "CU_FILE_DIO_NOT_SET",
	5021: "CU_FILE_EXPECTED_FILE_MODE", 5022: "CU_FILE_INVALID_VALUE",
	5023: "CU_FILE_MEMORY_ALREADY_REGISTERED", 5024: "CU_FILE_MEMORY_NOT_REGISTERED",
	5025: "CU_FILE_PERMISSION_DENIED", 5026: "CU_FILE_DRIVER_ALREADY_OPEN",
	5027: "CU_FILE_HANDLE_NOT_REGISTERED", 5028: "CU_FILE_HANDLE_ALREADY_REGISTERED",
	5029: "CU_FILE_DEVICE_NOT_FOUND", 5030: "CU_FILE_INTERNAL_ERROR",
	5031: "CU_FILE_GETNEWFD_FAILED", 5033: "CU_FILE_NVFS_SETUP_ERROR",
	5034: "CU_FILE_IO_DISABLED", 5035: "CU_FILE_BATCH_SUBMIT_FAILED",
	5036: "CU_FILE_GPU_MEMORY_PINNING_FAILED", 5037: "CU_FILE_BATCH_FULL",
	5038: "CU_FILE_ASYNC_NOT_SUPPORTED", 5039: "CU_FILE_INTERNAL_BATCH_SETUP_ERROR",
	5040: "CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR", 5041: "CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR",
	5042: "CU_FILE_INTERNAL_BATCH_CANCEL_ERROR", 5043: "CU_FILE_NOMEM_ERROR",
	5044: "CU_FILE_IO_ERROR", 5045: "CU_FILE_INTERNAL_BUF_REGISTER_ERROR",
	5046: "CU_FILE_HASH_OPR_ERROR", 5047: "CU_FILE_INVALID_CONTEXT_ERROR",
	5048: "CU_FILE_NVFS_INTERNAL_DRIVER_ERROR", 5049: "CU_FILE_BATCH_NOCOMPAT_ERROR",
}

func cuFileErrorName(code int) string {
	if n, ok := cuFileErrorNames[code]; ok {
		return n
	}
	return "unknown cuFile error"
}

// cuFileDriverHint guesses, for a failed cuFileDriverOpen, what is missing.
func cuFileDriverHint(code int) string {
	switch code {
	case 5001, 5010, 5033: // not initialized, nvidia-fs ioctl, nvidia-fs setup
		return "nvidia-fs not loaded?"
	case 5009, 5029: // device not supported, device not found
		return "no GPU that supports GPUDirect Storage?"
	case 5004, 5005: // driver version mismatch or unreadable
		return "NVIDIA driver and libcufile versions do not match?"
	}
	return "no NVIDIA driver?"
}
