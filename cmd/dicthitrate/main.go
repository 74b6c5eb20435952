// Command dicthitrate measures how close the adaptive engine dictionaries
// come to the oracle on a mixed-size workload in one directory, and prints
// the report (package hitrate's Report) as JSON on stdout.
//
//	go run ./cmd/dicthitrate -dir /mnt/nvme [-sizes 16] [-iterations 12] ...
//
// python -m benchmarks dict runs it and prints the report as a table.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/pyfastensor/pyfastensor/transfer/dict/hitrate"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); errors.Is(err, flag.ErrHelp) {
		return // -h: the usage is printed
	} else if err != nil {
		fmt.Fprintln(os.Stderr, "dicthitrate:", err)
		os.Exit(1)
	}
}

// run parses args, runs the workload and writes the report to out.
func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("dicthitrate", flag.ContinueOnError)
	var cfg hitrate.Config
	var write, read string
	fs.StringVar(&cfg.Dir, "dir", ".", "directory on the filesystem under test (the workload file is made and removed there)")
	fs.StringVar(&write, "write", "", "comma-separated write engines (default: every candidate)")
	fs.StringVar(&read, "read", "", "comma-separated read engines (default: every candidate)")
	fs.IntVar(&cfg.Sizes, "sizes", 0, "distinct transfer sizes (default 16)")
	fs.IntVar(&cfg.Iterations, "iterations", 0, "iterations (default 12, fewer over -budget)")
	fs.Int64Var(&cfg.MinSize, "min-size", 0, "smallest size in bytes (default 4096)")
	fs.Int64Var(&cfg.MaxSize, "max-size", 0, "largest size in bytes (default 64 MiB)")
	fs.Int64Var(&cfg.Budget, "budget", 0, "workload bytes per direction (default 1.5 GiB)")
	fs.IntVar(&cfg.Explore, "explore", 0, "samples per engine and bucket (default 1)")
	fs.IntVar(&cfg.Refresh, "refresh", 0, "refresh interval in transfers (default never)")
	fs.IntVar(&cfg.Repeat, "repeat", 0, "timings per engine and transfer, the median counts (default 3)")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "workload seed (default 1)")
	fs.BoolVar(&cfg.DropCaches, "drop-caches", false, "sync and drop the page cache first (root)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg.Write, cfg.Read = engines(write), engines(read)
	rep, err := hitrate.Run(cfg)
	if err != nil {
		return fmt.Errorf("hit-rate workload in %s: %w", cfg.Dir, err)
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return nil
}

// engines splits a comma-separated list; "" is nil (every candidate).
func engines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
