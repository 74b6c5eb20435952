package gds

import (
	"fmt"
	"sort"
	"strings"
	"sync"
)

// constructor builds an engine from options. It returns an error wrapping
// ErrUnavailable when the engine cannot work on this machine.
type constructor func(Options) (Engine, error)

var (
	registryMu sync.Mutex
	registry   = map[string]constructor{}
)

// register adds an engine constructor under name. Each engine's file calls
// it from init, so adding an engine touches no other file.
func register(name string, c constructor) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[name]; dup {
		panic("gds: engine registered twice: " + name)
	}
	registry[name] = c
}

// Names lists every engine this build knows, sorted.
func Names() []string {
	registryMu.Lock()
	defer registryMu.Unlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// New returns the engine called name. Unknown names wrap ErrInvalid; engines
// that cannot work here wrap ErrUnavailable with the reason.
func New(name string, opts Options) (Engine, error) {
	registryMu.Lock()
	c, ok := registry[name]
	registryMu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: unknown engine %q (known: %s)", ErrInvalid, name, strings.Join(Names(), ", "))
	}
	return c(opts)
}

func init() {
	register("posix", func(o Options) (Engine, error) { return NewPosix(o), nil })
}
