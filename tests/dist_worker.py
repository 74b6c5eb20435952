"""One rank of a distributed ChunkDataset for tests/test_data_dist.py (run as a script).

The argument is a JSON config; the result (every sample delivered as
(position, label, sha1 of its bytes), stats, any NodeFailedError) is
written as JSON to ``cfg["out"]``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg.get("torchrun"):  # launched by torchrun: everything from its environment
        cfg.update(rank=int(os.environ["RANK"]), world=int(os.environ["WORLD_SIZE"]))
        cfg["out"] = f"{cfg['out']}.{cfg['rank']}"
    else:
        os.environ["MASTER_ADDR"] = cfg["master_addr"]
        os.environ["MASTER_PORT"] = str(cfg["port"])
    os.environ.update(cfg.get("env", {}))
    import torch
    import torch.distributed as dist
    from data_helpers import digest, keep

    from pyfastensor import errors
    from pyfastensor.data import ChunkDataset

    result: dict = {"rank": cfg["rank"], "items": []}
    try:
        if cfg.get("torchrun"):
            dist.init_process_group("gloo")
        else:
            dist.init_process_group("gloo", init_method=f"tcp://{cfg['master_addr']}:{cfg['port']}", rank=cfg["rank"],
                                    world_size=cfg["world"], timeout=datetime.timedelta(seconds=60))
        ds = ChunkDataset(cfg["pack"], memory_budget=cfg["budget"], distributed=True, with_index=True,
                          overflow=cfg.get("overflow"), prefetch=cfg.get("prefetch", True),
                          remote_memory=cfg.get("remote"), timeout=cfg.get("timeout", 60.0))
        if cfg.get("state_in"):
            ds.load_state_dict(torch.load(cfg["state_in"]))
        else:
            ds.set_epoch(cfg.get("epoch", 0))
        rv = ds._rendezvous
        result["addresses"] = [bytes(rv.store.get(f"{rv.prefix}addr/{r}")).decode() for r in range(cfg["world"])]
        result["layout"] = ds.layout
        if cfg.get("hang"):  # a node that will be killed: joined, then idle
            open(cfg["ready"], "w").close()
            time.sleep(600)
        if cfg.get("wait_for"):
            deadline = time.monotonic() + 60
            while not os.path.exists(cfg["wait_for"]) and time.monotonic() < deadline:
                time.sleep(0.05)
        dl = torch.utils.data.DataLoader(ds, batch_size=cfg.get("batch", 16), sampler=ds.sampler(),
                                         collate_fn=keep, num_workers=cfg.get("workers", 0))
        t0 = time.perf_counter()
        try:
            for b, batch in enumerate(dl):
                result["items"] += [(int(i), int(label), digest(data)) for data, label, i in batch]
                if cfg.get("stop_after") is not None and b + 1 == cfg["stop_after"]:
                    break
        except errors.NodeFailedError as e:
            result["error"], result["error_type"] = str(e), type(e).__name__
        result["seconds"] = time.perf_counter() - t0
        if "error" not in result:
            if cfg.get("state_out"):
                torch.save(ds.state_dict(), cfg["state_out"])
            dist.barrier()  # a node serves the others' requests until every node is done
            result["stats"] = ds.stats()  # then its counters as owner are final too
    except Exception as e:  # reported to the test, which fails with it
        result["error"], result["error_type"] = f"{e}\n{traceback.format_exc()}", type(e).__name__
    with open(cfg["out"], "w") as f:
        json.dump(result, f)
    os._exit(0)  # not waiting on a peer that died (the process group's teardown would)


if __name__ == "__main__":
    main()
