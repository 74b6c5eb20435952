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
	registry   = map[string]*entry{}
)

// entry is one registration; unregistering compares entries, so removing
// a registration never removes a later one of the same name.
type entry struct{ build constructor }

// register adds an engine constructor under name. Each engine's file calls
// it from init, so adding an engine touches no other file.
func register(name string, c constructor) {
	if _, err := add(name, c); err != nil {
		panic("gds: engine registered twice: " + name)
	}
}

// add registers c under name unless the name is taken, or an engine it
// needs (a wrapper's base) is not registered, and returns the function that
// removes it again (idempotent).
func add(name string, c constructor, needs ...string) (func(), error) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[name]; dup {
		return nil, fmt.Errorf("%w: engine %q is already registered", ErrInvalid, name)
	}
	for _, n := range needs {
		if _, ok := registry[n]; !ok {
			return nil, fmt.Errorf("%w: engine %q needs engine %q, which is not registered", ErrInvalid, name, n)
		}
	}
	e := &entry{c}
	registry[name] = e
	return func() {
		registryMu.Lock()
		defer registryMu.Unlock()
		if registry[name] == e {
			delete(registry, name)
		}
	}, nil
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
	e, ok := registry[name]
	registryMu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: unknown engine %q (known: %s)", ErrInvalid, name, strings.Join(Names(), ", "))
	}
	return e.build(opts)
}

func init() {
	register("posix", func(o Options) (Engine, error) { return NewPosix(o), nil })
}
