package checkpoint

import (
	"errors"
	"sync"

	"github.com/pyfastensor/pyfastensor/gds"
)

// engineFiles holds the files of one save or load: the same path opened once
// per engine asked for (lazily, as records choose engines), and the bytes
// each engine actually moved. Safe for concurrent use.
type engineFiles struct {
	path     string
	flag     int
	opts     gds.Options
	progress func(int64) // may be nil

	mu      sync.Mutex
	files   map[string]gds.File // by engine asked for
	engines map[string]int64    // bytes by engine that served them
}

func newEngineFiles(path string, flag int, opts gds.Options, progress func(int64)) *engineFiles {
	if name := shownName(path); name != path {
		opts.Name = name // a pinned file's errors name its path, not /proc/self/fd/N
	}
	return &engineFiles{path: path, flag: flag, opts: opts, progress: progress,
		files: map[string]gds.File{}, engines: map[string]int64{}}
}

// file returns path opened through engine, opening it on first use.
func (e *engineFiles) file(engine string) (gds.File, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f, ok := e.files[engine]; ok {
		return f, nil
	}
	eng, err := gds.New(engine, e.opts)
	if err != nil {
		return nil, err
	}
	f, err := eng.Open(e.path, e.flag, 0)
	if err != nil {
		return nil, err
	}
	e.files[engine] = f
	return f, nil
}

// count records n bytes moved by engine and reports them as progress.
func (e *engineFiles) count(engine string, n int64) {
	e.mu.Lock()
	e.engines[engine] += n
	e.mu.Unlock()
	if e.progress != nil {
		e.progress(n)
	}
}

// close closes every file opened.
func (e *engineFiles) close() error {
	var errs []error
	for _, f := range e.files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}
