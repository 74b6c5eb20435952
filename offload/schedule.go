// Package offload decides which saved activations to offload and how,
// from what the profiling step measured: FlashNeuron's offloading
// scheduler (linear selection, then compression-aware selection).
//
// It knows sizes and times, not tensors: the Python side records a Profile
// during the profiling step and applies the Plan on later steps.
package offload

import (
	"fmt"
	"sort"
	"strings"
)

// Tensor is what the profiling step recorded for one stored tensor.
type Tensor struct {
	Index   int   `json:"index"`    // pack order in the forward pass
	Size    int64 `json:"size"`     // bytes
	WriteNs int64 `json:"write_ns"` // time to write it uncompressed
	ReadNs  int64 `json:"read_ns"`  // time to read it back
	// Ratios is the compression ratio (raw / encoded bytes) under each
	// codec the user allowed ("sparse", "fp16", "fp16+sparse"); absent
	// where the codec does not apply.
	Ratios map[string]float64 `json:"ratios,omitempty"`
	// CodecNs is the compute a codec adds on the critical path (encode in
	// pack, decode in unpack), measured in the profiling step; a codec
	// absent here is taken to cost nothing.
	CodecNs map[string]int64 `json:"codec_ns,omitempty"`
	Relu    bool             `json:"relu"`   // a ReLU output (grad_fn)
	GapNs   int64            `json:"gap_ns"` // forward compute since the previous save
	// BwdGapNs is the backward compute before its first unpack since the
	// previous unpack ended (-1: never unpacked in the profiling step).
	// Recorded for prefetch planning; Schedule uses the totals.
	BwdGapNs int64 `json:"bwd_gap_ns"`
}

// Profile is the profiling step's record.
type Profile struct {
	Tensors    []Tensor `json:"tensors"`
	ForwardNs  int64    `json:"forward_ns"`  // forward compute, offload excluded
	BackwardNs int64    `json:"backward_ns"` // backward compute, offload excluded
	// Budget is the bytes of saved tensors that may stay resident.
	Budget int64 `json:"budget"`
	// Tier is where offloaded tensors go ("ssd" or "host"; "" reads as ssd).
	Tier string `json:"tier,omitempty"`
}

// Decision is the plan for one tensor.
type Decision struct {
	Index      int    `json:"index"`
	Offload    bool   `json:"offload"`
	Codec      string `json:"codec,omitempty"` // "raw", "sparse", "fp16", "fp16+sparse"
	Size       int64  `json:"size"`
	Stored     int64  `json:"stored"` // bytes written (after compression)
	TransferNs int64  `json:"transfer_ns"`
}

// Plan is the scheduler's decision for every profiled tensor.
type Plan struct {
	Decisions     []Decision `json:"decisions"`
	Tier          string     `json:"tier"`  // where offloaded tensors go
	Phase         int        `json:"phase"` // 1: linear selection sufficed; 2: compression-aware
	ResidentBytes int64      `json:"resident_bytes"`
	Budget        int64      `json:"budget"`
	FitsBudget    bool       `json:"fits_budget"`
	TransferNs    int64      `json:"transfer_ns"` // predicted write time of the offloaded set
	ForwardNs     int64      `json:"forward_ns"`
	// Overlap is forward compute over transfer time: at least 1 means the
	// writes hide behind the forward pass.
	Overlap float64  `json:"overlap"`
	Notes   []string `json:"notes,omitempty"`
	Text    string   `json:"text"`
}

// transfer is the predicted write time of t under codec.
func transfer(t Tensor, codec string) int64 {
	r := ratio(t, codec)
	return int64(float64(t.WriteNs) / r)
}

func ratio(t Tensor, codec string) float64 {
	if codec == "" || codec == "raw" {
		return 1
	}
	if r, ok := t.Ratios[codec]; ok && r > 0 {
		return r
	}
	return 1
}

// bestCodec is the allowed codec with the highest ratio above 1 that pays
// for itself (the write time it saves exceeds its encode and decode time,
// which, unlike the write, sit on the critical path), or "raw".
func bestCodec(t Tensor) (string, float64) {
	best, br := "raw", 1.0
	names := make([]string, 0, len(t.Ratios))
	for c := range t.Ratios {
		names = append(names, c)
	}
	sort.Strings(names) // deterministic on ties
	for _, c := range names {
		r := t.Ratios[c]
		if r > br && t.WriteNs-transfer(t, c) > t.CodecNs[c] {
			best, br = c, r
		}
	}
	return best, br
}

// Schedule runs FlashNeuron's two phases over a profile.
//
// Phase 1 (linear selection): offload tensors in forward order until the
// tensors left resident fit the budget; earlier tensors wait longest for
// backward, so they are the cheapest to evict. If writing the selected set
// takes no longer than the forward compute, the plan is done.
//
// Phase 2 (compression-aware selection): while the transfers exceed the
// forward compute, take the selected tensor with the highest compression
// ratio not yet compressed and compress it; when none is left, replace a
// selected uncompressible tensor by an unselected compressible one at least
// as large (which keeps the budget). It stops when transfers fit, or when
// no tensor can help, in which case the plan predicts a stall.
func Schedule(p Profile) Plan {
	ts := append([]Tensor(nil), p.Tensors...)
	sort.Slice(ts, func(i, j int) bool { return ts[i].Index < ts[j].Index })
	dec := make([]Decision, len(ts))
	var total int64
	for i, t := range ts {
		dec[i] = Decision{Index: t.Index, Size: t.Size}
		total += t.Size
	}
	plan := Plan{Budget: p.Budget, ForwardNs: p.ForwardNs, Phase: 1, Tier: p.Tier}
	if plan.Tier == "" {
		plan.Tier = "ssd"
	}

	// Phase 1.
	resident := total
	for i := range ts {
		if resident <= p.Budget {
			break
		}
		dec[i].Offload, dec[i].Codec = true, "raw"
		resident -= ts[i].Size
	}
	plan.FitsBudget = resident <= p.Budget
	cost := func() int64 {
		var s int64
		for i, d := range dec {
			if d.Offload {
				s += transfer(ts[i], d.Codec)
			}
		}
		return s
	}

	// Phase 2.
	for cost() > p.ForwardNs {
		plan.Phase = 2
		if i := mostCompressible(ts, dec, true); i >= 0 {
			dec[i].Codec, _ = bestCodec(ts[i])
			continue
		}
		if swapIn(ts, dec) {
			continue
		}
		plan.Notes = append(plan.Notes, "no more compressible tensors: transfers will outlast the forward pass")
		break
	}

	resident = 0
	for i := range dec {
		if dec[i].Offload {
			dec[i].Stored = int64(float64(ts[i].Size) / ratio(ts[i], dec[i].Codec))
			dec[i].TransferNs = transfer(ts[i], dec[i].Codec)
		} else {
			resident += ts[i].Size
		}
	}
	plan.Decisions, plan.ResidentBytes, plan.TransferNs = dec, resident, cost()
	if plan.TransferNs > 0 {
		plan.Overlap = float64(p.ForwardNs) / float64(plan.TransferNs)
	}
	if !plan.FitsBudget {
		plan.Notes = append(plan.Notes, "even offloading everything leaves more resident than the budget")
	}
	plan.Text = plan.String()
	return plan
}

// mostCompressible returns the selected (or, with selected false,
// unselected) raw tensor with the highest ratio above 1, or -1.
func mostCompressible(ts []Tensor, dec []Decision, selected bool) int {
	best, br := -1, 1.0
	for i := range ts {
		if dec[i].Offload != selected || (selected && dec[i].Codec != "raw") {
			continue
		}
		if _, r := bestCodec(ts[i]); r > br {
			best, br = i, r
		}
	}
	return best
}

// swapIn replaces a selected raw, uncompressible tensor by an unselected
// compressible one at least as large, compressed. It reports whether it
// made a swap.
func swapIn(ts []Tensor, dec []Decision) bool {
	in := mostCompressible(ts, dec, false)
	if in < 0 {
		return false
	}
	out := -1
	for i := range ts {
		if dec[i].Offload && dec[i].Codec == "raw" && ts[i].Size <= ts[in].Size &&
			(out < 0 || ts[i].WriteNs > ts[out].WriteNs) {
			out = i
		}
	}
	if out < 0 {
		return false
	}
	codec, _ := bestCodec(ts[in])
	if transfer(ts[in], codec) >= transfer(ts[out], "raw") {
		return false
	}
	dec[out].Offload, dec[out].Codec = false, ""
	dec[in].Offload, dec[in].Codec = true, codec
	return true
}

// String prints the plan: which tensors, to which tier, with which codec,
// and the predicted overlap of transfers with the forward pass.
func (p Plan) String() string {
	var b strings.Builder
	const mib = 1 << 20
	fmt.Fprintf(&b, "offload plan (phase %d): resident %.1f MiB of budget %.1f MiB; transfers %.1f ms vs forward %.1f ms (overlap %.2fx)\n",
		p.Phase, float64(p.ResidentBytes)/mib, float64(p.Budget)/mib,
		float64(p.TransferNs)/1e6, float64(p.ForwardNs)/1e6, p.Overlap)
	for _, d := range p.Decisions {
		if d.Offload {
			fmt.Fprintf(&b, "  #%-3d %8.2f MiB  offload to %-4s %-11s -> %8.2f MiB  %7.2f ms\n",
				d.Index, float64(d.Size)/mib, p.Tier, d.Codec, float64(d.Stored)/mib, float64(d.TransferNs)/1e6)
		} else {
			fmt.Fprintf(&b, "  #%-3d %8.2f MiB  resident\n", d.Index, float64(d.Size)/mib)
		}
	}
	for _, n := range p.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	return b.String()
}
