package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"unsafe"

	"github.com/pyfastensor/pyfastensor/hooks"
)

// The activation-offload store (hooks.Store) behind pyfastensor.offload.
// A store is a handle; its slots are plain integers within it (not handles).

// pft_store_open opens a store of tier ("ssd" or "host") spilling into
// dir (NULL: the system's temporary directory); options: its engine (""
// lets the store probe dir), or dict and dict_use (pft_dict_decide's use:
// 1 write+read, 2 write, 3 read) for the dictionaries' view that picks the
// engine of every transfer, and workers, threads, task_size. out receives
// the store's handle.
//
//export pft_store_open
func pft_store_open(tier, dir *C.char, options *C.char, out *C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		o, err := parseOptions(options)
		if err != nil {
			return err
		}
		cfg := hooks.Config{
			Tier:    C.GoString(tier),
			Workers: o.Workers,
			Options: o.engine(),
			Engine:  o.Engine,
		}
		if dir != nil {
			cfg.Dir = C.GoString(dir)
		}
		if o.Dict != 0 {
			v, err := o.view()
			if err != nil {
				return err
			}
			cfg.Picker = v
		}
		s, err := hooks.Open(cfg)
		if err != nil {
			return err
		}
		*out = newHandle(s)
		return nil
	})
}

// pft_store_account opens an account in the store (hooks.Store.NewAccount):
// the slots put in it count their transfers there too, for one of the
// store's several users.
//
//export pft_store_account
func pft_store_account(h C.uint64_t, acct *C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := lookup[*hooks.Store](h)
		if err != nil {
			return err
		}
		a, err := s.NewAccount()
		*acct = C.uint64_t(a)
		return err
	})
}

// pft_store_put starts writing n bytes at addr into a new slot, counted in
// account acct (0: none) as well as in the store's totals.
//
// Memory: the caller keeps [addr, addr+n) alive and unchanged until the
// slot's write completes (pft_store_wait returns, pft_store_poll reports it
// done, or pft_store_free / pft_store_close returns).
//
//export pft_store_put
func pft_store_put(h, acct C.uint64_t, addr unsafe.Pointer, n C.size_t, slot *C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := lookup[*hooks.Store](h)
		if err != nil {
			return err
		}
		p, err := memory(addr, n)
		if err != nil {
			return err
		}
		id, err := s.PutIn(hooks.Account(acct), p)
		*slot = C.uint64_t(id)
		return err
	})
}

// pft_store_wait blocks until the slot's write completes; its status is the
// write's (stNoSpace for a full spill filesystem).
//
//export pft_store_wait
func pft_store_wait(h, slot C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := lookup[*hooks.Store](h)
		if err != nil {
			return err
		}
		return s.Wait(hooks.SlotID(slot))
	})
}

// pft_store_poll sets *done to 1 when the slot's write completed (the
// status is then the write's) and to 0 while it runs.
//
//export pft_store_poll
func pft_store_poll(h, slot C.uint64_t, done *C.int, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := lookup[*hooks.Store](h)
		if err != nil {
			return err
		}
		ok, err := s.Poll(hooks.SlotID(slot))
		*done = 0
		if ok {
			*done = 1
		}
		return err
	})
}

// pft_store_completed writes up to max ids of slots whose writes completed
// since the last call into out, and their count into *count.
//
// Memory: out holds max uint64s and is used only during the call.
//
//export pft_store_completed
func pft_store_completed(h C.uint64_t, out *C.uint64_t, max C.int64_t, count *C.int64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := lookup[*hooks.Store](h)
		if err != nil {
			return err
		}
		*count = 0
		if max <= 0 || out == nil {
			return nil
		}
		ids := s.Completed(int(max))
		dst := unsafe.Slice((*C.uint64_t)(out), int(max))
		for i, id := range ids {
			dst[i] = C.uint64_t(id)
		}
		*count = C.int64_t(len(ids))
		return nil
	})
}

// pft_store_prefetch starts reading the slot ahead of pft_store_get, into
// [addr, addr+n) when addr is not NULL (n must be the slot's size), else
// into memory the library owns.
//
// Memory: a caller buffer is written until pft_store_get or pft_store_free
// of the slot (or pft_store_close) returns; the caller keeps it alive until
// then.
//
//export pft_store_prefetch
func pft_store_prefetch(h, slot C.uint64_t, addr unsafe.Pointer, n C.size_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := lookup[*hooks.Store](h)
		if err != nil {
			return err
		}
		var dst []byte
		if addr != nil {
			if dst, err = memory(addr, n); err != nil {
				return err
			}
		}
		return s.Prefetch(hooks.SlotID(slot), dst)
	})
}

// pft_store_get fills [addr, addr+n) (n = the slot's size) with the slot's
// bytes, from its prefetch if any. The slot stays readable.
//
// Memory: used only during the call.
//
//export pft_store_get
func pft_store_get(h, slot C.uint64_t, addr unsafe.Pointer, n C.size_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := lookup[*hooks.Store](h)
		if err != nil {
			return err
		}
		p, err := memory(addr, n)
		if err != nil {
			return err
		}
		return s.Get(hooks.SlotID(slot), p)
	})
}

// pft_store_free releases a slot after its write and any prefetch finish;
// the memory given to put may be dropped once it returns.
//
//export pft_store_free
func pft_store_free(h, slot C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := lookup[*hooks.Store](h)
		if err != nil {
			return err
		}
		return s.Free(hooks.SlotID(slot))
	})
}

// pft_store_stats returns account acct's figures as JSON (hooks.Stats;
// acct 0: the store's totals).
//
//export pft_store_stats
func pft_store_stats(h, acct C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := lookup[*hooks.Store](h)
		if err != nil {
			return err
		}
		st, err := s.StatsOf(hooks.Account(acct))
		if err != nil {
			return err
		}
		return putJSON(out, st)
	})
}

// pft_store_describe returns what serves the store as JSON
// (hooks.Description).
//
//export pft_store_describe
func pft_store_describe(h C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := lookup[*hooks.Store](h)
		if err != nil {
			return err
		}
		return putJSON(out, s.Describe())
	})
}

// pft_store_slot_info returns what the store measured for a slot as JSON
// (hooks.SlotInfo).
//
//export pft_store_slot_info
func pft_store_slot_info(h, slot C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := lookup[*hooks.Store](h)
		if err != nil {
			return err
		}
		info, err := s.Info(hooks.SlotID(slot))
		if err != nil {
			return err
		}
		return putJSON(out, info)
	})
}

// pft_store_close waits for transfers in flight, frees every slot, closes
// the spill file (which vanishes) and releases the handle.
//
//export pft_store_close
func pft_store_close(h C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := release[*hooks.Store](h)
		if err != nil {
			return err
		}
		return s.Close()
	})
}
