package frontend

import "github.com/pyfastensor/pyfastensor/loader"

// Summary describes an opened pack without its index (which holds a
// record per sample) and, for a server, its layout.
type Summary struct {
	Dir       string         `json:"dir"`
	Version   uint32         `json:"version"`
	Samples   int            `json:"samples"`
	Chunks    int            `json:"chunks"`
	ChunkSize int            `json:"chunk_size"`
	Seed      uint64         `json:"seed"` // of the pack's shuffle
	Classes   []string       `json:"classes"`
	DataBytes int64          `json:"data_bytes"`
	FileBytes int64          `json:"file_bytes"`
	Layout    *LayoutSummary `json:"layout,omitempty"` // a server's; none for a pack alone
}

// LayoutSummary is a server's layout without its list of owned abstract
// chunks (every one, on one node).
type LayoutSummary struct {
	loader.Layout
	Owned []int `json:"owned,omitempty"` // nil: hides Layout.Owned
}

// Summarize describes the pack p and, when lay is not nil, a server's
// layout of it.
func Summarize(p *loader.Packed, lay *loader.Layout) Summary {
	ix := p.Index
	s := Summary{Dir: p.Dir, Version: ix.Version, Samples: ix.Len(), Chunks: len(ix.Chunks),
		ChunkSize: ix.ChunkSize, Seed: ix.Seed, Classes: ix.Classes}
	for _, c := range ix.Chunks {
		s.DataBytes += c.DataLength
		s.FileBytes += c.Length
	}
	if lay != nil {
		s.Layout = &LayoutSummary{Layout: *lay}
	}
	return s
}

// Verify re-reads every chunk file of the pack in dir and checks it
// against the index (loader.VerifyPack), then describes the pack.
// progress: nil, or called with (chunk bytes checked, chunk bytes).
func Verify(dir string, progress func(done, total int64)) (Summary, error) {
	if err := loader.VerifyPack(dir, progress); err != nil {
		return Summary{}, err
	}
	p, err := loader.OpenPack(dir)
	if err != nil {
		return Summary{}, err
	}
	return Summarize(p, nil), nil
}
