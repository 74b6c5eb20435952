// Command gofastensor is pyfastensor's C ABI: built with
// `go build -buildmode=c-shared`, loaded by Python with ctypes.
//
// Nothing but the boundary lives here. Every exported function has the same
// shape (see call in abi.go): it returns a status code, writes a message the
// caller can read into the caller's error buffer, never lets a Go panic
// cross into C, and refers to Go objects only through integer handles.
//
// Memory crosses as an address and a length. Go uses such memory only for
// the duration of the call (or of the operation the call starts, as stated
// on that call) and never keeps a pointer into it.
package main

// version is set at build time by setup.py (-ldflags -X main.version=...).
var version = "dev"

func main() {}
