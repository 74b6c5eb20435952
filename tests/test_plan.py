"""pyfastensor.plan: traces, hardware, the simulator and the planner through the C ABI, the
``trace`` recorder on built-in models, and ``bench plan`` on a tiny configuration."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import main
from pyfastensor import CorruptFileError, InvalidArgumentError, NotFoundError, plan
from pyfastensor.plan import GLOBAL_KINDS, Hardware, Trace

ROOT = Path(__file__).resolve().parents[1]  # where `python -m benchmarks` runs

SEED = {"version": 1,
        "tensors": [{"id": 0, "bytes": 4096, "kind": "weight"}, {"id": 3, "bytes": 100, "kind": "input"},
                    {"id": 4, "bytes": 800, "kind": "activation"}, {"id": 5, "bytes": 800, "kind": "gradient"}],
        "ops": [{"name": "layer1.fwd", "time_ns": 12000, "reads": [0, 3], "writes": [4]},
                {"name": "loss", "time_ns": 1000, "reads": [], "writes": []},
                {"name": "layer1.bwd", "time_ns": 20000, "reads": [4, 0], "writes": [5]}]}

TINY = ["--batch", "2", "--layers", "1", "--width", "16"]


def layered(layers: int = 8, act: int = 1 << 20, weight: int = 1 << 16, ns: int = 1_000_000) -> Trace:
    """A forward and backward pass over ``layers`` layers, as offload/g10_test.go's ``layered``."""
    tensors: list[dict] = []
    ops: list[dict] = []

    def add(b: int, kind: str) -> int:
        tensors.append({"id": len(tensors), "bytes": b, "kind": kind})
        return len(tensors) - 1

    acts, ws = [add(act, "input")], []
    for i in range(layers):
        w, x = add(weight, "weight"), add(act, "activation")
        ops.append({"name": f"l{i}.fwd", "time_ns": ns, "reads": [acts[-1], w], "writes": [x]})
        acts.append(x)
        ws.append(w)
    g = add(act, "gradient")
    ops.append({"name": "loss", "time_ns": ns // 10, "reads": [acts[-1]], "writes": [g]})
    for i in reversed(range(layers)):
        g2, gw = add(act, "gradient"), add(weight, "gradient")
        ops.append({"name": f"l{i}.bwd", "time_ns": 2 * ns, "reads": [acts[i], ws[i], g], "writes": [g2, gw]})
        g = g2
    return Trace.from_dict({"version": 1, "tensors": tensors, "ops": ops})


def test_import_needs_no_torch():
    code = "import sys, pyfastensor.plan; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))


def test_trace_round_trip(tmp_path):
    t = Trace.from_dict(SEED)
    assert t.to_dict() == SEED
    assert [x.kind for x in t.tensors] == ["weight", "input", "activation", "gradient"]
    assert t.ops[2].reads == (4, 0)
    path = tmp_path / "t.json"
    t.save(path)
    loaded = Trace.load(path)
    assert loaded == t
    assert Trace.from_dict(json.loads(path.read_text())) == t
    assert t.total_ns == 33000
    assert t.total_bytes == 5796


def test_from_dict_normalizes_missing_lists_and_ignores_unknown_fields():
    d = {"version": 1, "comment": "x", "tensors": [{"id": 1, "bytes": 8, "kind": "weight", "name": "w"}],
         "ops": [{"name": "a", "time_ns": 5, "reads": [1]}]}
    t = Trace.from_dict(d)
    assert t.ops[0].writes == ()
    assert t.to_dict() == {"version": 1, "tensors": [{"id": 1, "bytes": 8, "kind": "weight"}],
                           "ops": [{"name": "a", "time_ns": 5, "reads": [1], "writes": []}]}


def _with(**changes) -> dict:
    d = json.loads(json.dumps(SEED))
    for k, v in changes.items():
        d[k] = v
    return d


@pytest.mark.parametrize("d, message", [
    (_with(version=2), "version 2, want 1"),
    (_with(tensors=SEED["tensors"] + [{"id": 0, "bytes": 1, "kind": "weight"}]), "tensor 0 (entry 4): duplicate id"),
    (_with(tensors=[{"id": 0, "bytes": 1, "kind": "blob"}]), 'unknown kind "blob"'),
    (_with(tensors=[{"id": 0, "bytes": -1, "kind": "weight"}]), "negative size"),
    (_with(ops=[{"name": "a", "time_ns": -5}]), 'op 0 ("a"): negative time_ns -5'),
    (_with(ops=[{"name": "a", "time_ns": 5, "reads": [9]}]), 'op 0 ("a") reads tensor 9, which the trace does not declare'),
    (_with(ops=[{"name": "b", "time_ns": 5, "reads": [4]}]), 'op 0 ("b") reads activation tensor 4 before any op writes it'),
    (_with(ops=[{"name": "c", "time_ns": 5, "writes": [4, 4]}]), "lists tensor 4 twice in writes"),
    ([1, 2], "decoding JSON"),
])
def test_invalid_trace_is_an_invalid_argument_naming_the_fault(d, message):
    with pytest.raises(InvalidArgumentError, match="invalid trace") as e:
        Trace.from_dict(d)
    assert message in str(e.value)


def test_from_dict_of_non_json_data():
    with pytest.raises(InvalidArgumentError, match="not JSON data"):
        Trace.from_dict({"version": 1, "tensors": [object()], "ops": []})


def test_load_of_a_bad_file_is_corrupt_and_names_the_path(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_with(ops=[{"name": "late", "time_ns": 5, "reads": [5]}])))
    with pytest.raises(CorruptFileError) as e:
        Trace.load(bad)
    assert str(bad) in str(e.value)
    assert 'op 0 ("late") reads gradient tensor 5 before any op writes it' in str(e.value)
    junk = tmp_path / "junk.json"
    junk.write_text('{"version": 1, "tensors": [], "ops": []} trailing')
    with pytest.raises(CorruptFileError, match="trailing data"):
        Trace.load(junk)
    with pytest.raises(NotFoundError):
        Trace.load(tmp_path / "missing.json")


def test_load_reads_gzip_compressed_traces(tmp_path):
    gz = tmp_path / "seed.json.gz"
    gz.write_bytes(gzip.compress(json.dumps(SEED).encode()))
    assert Trace.load(gz) == Trace.from_dict(SEED)
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gz.read_bytes()[:20])
    with pytest.raises(CorruptFileError, match="gzip") as e:
        Trace.load(cut)
    assert str(cut) in str(e.value)


_LONG_RUN = """
import json, sys
from pyfastensor import plan
from pyfastensor.plan import Hardware, Trace
t, hw, f = Trace.from_dict(json.loads(sys.argv[1])), Hardware(**json.loads(sys.argv[2])), int(sys.argv[3])
long = t.scale_time(f)
lhw = hw.replace(ssd_read_bps=hw.ssd_read_bps / f, ssd_write_bps=hw.ssd_write_bps / f,
                 host_link_bps=hw.host_link_bps / f, ssd_latency_ns=hw.ssd_latency_ns * f)
print(json.dumps({p: [plan.simulate(x, h, p).throughput for x, h in ((t, hw), (long, lhw))]
                  for p in plan.policies()} | {"ideal_ns": long.total_ns}))
"""


def test_iterations_of_minutes_plan_and_simulate_as_milliseconds_do():
    # The same problem in a unit of time 2^17 times larger (op times and latency up, bandwidths
    # down): iterations of minutes, where a float64 clock cannot tell t from t + 1e-5 ns. A power
    # of two, so the hardware lands on the same points of the planner's grid (its link steps are
    # octaves).
    t = layered(12, act=64 << 20, weight=4 << 20)
    peak = plan.simulate(t, Hardware.g10_default(), "ideal").peak_device_bytes
    hw = Hardware.g10_default().replace(device_bytes=peak // 2, host_bytes=256 << 20)
    out = subprocess.run([sys.executable, "-c", _LONG_RUN, t.to_json(), hw.to_json(), str(1 << 17)],
                         capture_output=True, text=True, timeout=60, check=True,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    got = json.loads(out.stdout)
    assert got.pop("ideal_ns") > 100 * 10**9
    for policy, (ms, minutes) in got.items():
        assert 0 < ms <= 1 and minutes == pytest.approx(ms, abs=1e-3), policy
    assert got["g10"][0] < 1  # something had to move


def test_g10_default_is_table_2():
    hw = Hardware.g10_default()
    # The seed's Table 2: A100 40 GB, 128 GB DDR4, Z-NAND 3.2/3.0 GB/s with 20 us read latency,
    # PCIe Gen3 x16 at 15.754 GB/s (offload.G10Default reads GB of memory as GiB).
    assert hw == Hardware(device_bytes=40 << 30, host_bytes=128 << 30, ssd_read_bps=3.2e9, ssd_write_bps=3.0e9,
                          ssd_latency_ns=20_000, host_link_bps=15.754e9)
    assert hw.replace(device_bytes=1).device_bytes == 1
    assert set(plan.policies()) == {"ideal", "on_demand", "flashneuron", "g10"}
    assert set(GLOBAL_KINDS) < set(Trace.kinds())


def test_g10_artifact_differs_from_table_2_in_the_ssd_only():
    art, t2 = Hardware.g10_artifact(), Hardware.g10_default()
    assert art == t2.replace(ssd_write_bps=3.2e9, ssd_latency_ns=16_000)


def test_invalid_hardware_and_policy():
    t = Trace.from_dict(SEED)
    with pytest.raises(InvalidArgumentError, match="invalid hardware"):
        plan.simulate(t, Hardware.g10_default().replace(ssd_read_bps=0), "g10")
    with pytest.raises(InvalidArgumentError, match='unknown policy "lru"'):
        plan.simulate(t, Hardware.g10_default(), "lru")


@pytest.mark.parametrize("trace", [Trace.from_dict(SEED), layered(5)], ids=["seed", "layered"])
def test_ideal_is_the_sum_of_op_times(trace):
    r = plan.simulate(trace, Hardware.g10_default().replace(device_bytes=1), "ideal")
    assert r.feasible
    assert r.time_ns == r.ideal_ns == sum(o.time_ns for o in trace.ops)
    assert r.stall_ns == 0
    assert r.throughput == 1.0
    assert len(r.op_slowdown) == len(trace.ops) and set(r.op_slowdown) == {1.0}
    assert r.ssd_write_bytes == r.host_write_bytes == 0


def test_infeasible_is_reported_naming_the_capacity():
    t = Trace.from_dict(SEED)
    small = Hardware.g10_default().replace(device_bytes=1000)
    for policy in ("on_demand", "flashneuron", "g10"):
        r = plan.simulate(t, small, policy)
        assert not r.feasible, policy
        assert r.throughput == 0.0
        assert "capacity of 1000 bytes" in r.error, r.error
    with pytest.raises(InvalidArgumentError, match=r'op 0 \("layer1.fwd"\) alone needs 4996 bytes.*capacity of 1000'):
        plan.make_plan(t, small)


@pytest.mark.parametrize("demand", [1.5, 2.0, 3.0, 4.0])
def test_planner_never_exceeds_capacity(demand):
    t = layered(16)
    peak = plan.simulate(t, Hardware.g10_default(), "ideal").peak_device_bytes
    hw = Hardware.g10_default().replace(device_bytes=int(peak / demand))
    p = plan.make_plan(t, hw)
    assert p.demand_bytes == peak
    # A point of the planner's grid at or below the hardware: at most 2^(1/8) below it.
    assert hw.device_bytes / 2 ** (1 / 8) <= p.capacity <= hw.device_bytes
    assert p.host_capacity is not None and p.host_capacity <= hw.host_bytes
    assert p.migrations
    assert p.peak_bytes <= p.capacity
    for policy in plan.policies()[1:]:
        r = plan.simulate(t, hw, policy)
        assert r.feasible, r.error
        assert r.peak_device_bytes <= hw.device_bytes, policy
        assert r.ssd_write_bytes + r.host_write_bytes > 0, policy  # something had to move
        assert r.time_ns >= r.ideal_ns


def test_planner_moves_nothing_with_memory_to_spare():
    t = layered(16)
    peak = plan.simulate(t, Hardware.g10_default(), "ideal").peak_device_bytes
    hw = Hardware.g10_default().replace(device_bytes=peak)
    p = plan.make_plan(t, hw)
    assert p.migrations == ()
    assert p.peak_bytes == p.demand_bytes == peak
    r = plan.simulate(t, hw, "g10")
    assert r.time_ns == r.ideal_ns
    assert r.ssd_write_bytes == r.ssd_read_bytes == r.host_write_bytes == r.host_read_bytes == 0


def test_bound_ns():
    t = layered(16)
    peak = plan.simulate(t, Hardware.g10_default(), "ideal").peak_device_bytes
    assert plan.bound_ns(t, Hardware.g10_default().replace(device_bytes=peak)) == t.total_ns
    for demand in (1.5, 4.0):
        for host in (0, 128 << 30):
            hw = Hardware.g10_default().replace(device_bytes=int(peak / demand), host_bytes=host)
            b = plan.bound_ns(t, hw)
            assert b >= t.total_ns
            for policy in plan.policies()[1:]:
                assert plan.simulate(t, hw, policy).time_ns >= b, (demand, host, policy)
    assert plan.bound_ns(Trace.from_dict(SEED), Hardware.g10_default().replace(device_bytes=1000)) == 0


def test_plan_prints_as_a_table():
    t = layered(16)
    peak = plan.simulate(t, Hardware.g10_default(), "ideal").peak_device_bytes
    p = plan.make_plan(t, Hardware.g10_default().replace(device_bytes=peak // 2))
    text = str(p)
    assert text == p.table()
    lines = text.strip("\n").splitlines()
    assert lines[0].startswith(f"capacity {p.capacity} bytes, demand {peak}")
    assert f"{len(p.migrations)} migrations" in lines[0]
    assert lines[1].split() == ["tensor", "bytes", "tier", "evict_after", "prefetch_at", "need"]
    assert len(lines) == 2 + len(p.migrations)
    for line, m in zip(lines[2:], p.migrations, strict=True):
        assert line.split()[:6] == [str(m.tensor), str(m.bytes), m.tier, str(m.evict_after),
                                     str(m.prefetch_at), str(m.need)]
        assert m.tier in ("ssd", "host")


def test_scale_time():
    t = Trace.from_dict(SEED)
    half = t.scale_time(0.5)
    assert [o.time_ns for o in half.ops] == [6000, 500, 10000]
    assert half.tensors == t.tensors
    with pytest.raises(InvalidArgumentError, match="positive"):
        t.scale_time(0)


def _check_consistent(t: Trace) -> None:
    """Every tensor an op reads was written by an earlier op or is alive from the start."""
    kind = {x.id: x.kind for x in t.tensors}
    written: set[int] = set()
    for o in t.ops:
        for i in o.reads:
            assert kind[i] in GLOBAL_KINDS or i in written, f"{o.name} reads {kind[i]} {i} before a write"
        written.update(o.writes)
    used = {i for o in t.ops for i in (*o.reads, *o.writes)}
    assert used == set(kind), "the trace declares tensors no op uses"


@pytest.mark.parametrize("model", ["bert", "vit", "resnet"])
def test_trace_cli_records_a_consistent_trace(tmp_path, capsys, model):
    out = tmp_path / f"{model}.json"
    assert main(["trace", model, *TINY, str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    t = Trace.load(out)
    _check_consistent(t)
    assert {x.kind for x in t.tensors} == set(Trace.kinds())
    phases = [o.name.split(".")[0] for o in t.ops]
    assert phases == sorted(phases, key=["fwd", "bwd", "step"].index)
    assert set(phases) == {"fwd", "bwd", "step"}
    assert all(o.time_ns > 0 for o in t.ops)

    torch = pytest.importorskip("torch")
    from benchmarks.workloads import build

    w = build(model, 2, layers=1, width=16)
    weights = sum(x.bytes for x in t.tensors if x.kind == "weight")
    params = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
              for p in (*w.model.parameters(), *w.model.buffers())}
    assert weights == sum(params.values())
    inputs = sum(x.bytes for x in t.tensors if x.kind == "input")
    assert inputs >= sum(b.untyped_storage().nbytes() for b in w.batch)
    del torch


def _tiny_step():
    torch = pytest.importorskip("torch")
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    return model, (torch.randn(8, 32), torch.randint(0, 10, (8,))), lambda m, x, y: nn.functional.cross_entropy(m(x), y)


def test_record_on_cpu_says_it_timed_ops_on_cpu(tmp_path):
    from pyfastensor.plan import record_trace

    t = record_trace(*_tiny_step())
    assert t.meta == {"op_time": "cpu", "device": "cpu"}
    t.save(tmp_path / "t.json")
    back = Trace.load(tmp_path / "t.json")
    assert back.meta == t.meta and back == t
    assert t.scale_time(0.5).scale_time(0.5).meta == {**t.meta, "time_scale": 0.25}


def test_record_on_cuda_times_each_op_by_cuda_events(monkeypatch):
    # A fake CUDA clock: every event recorded moves it 0.25 ms on, so each op (two events) takes
    # 0.25 ms, whatever the host's clock says; the end event must be waited for before it is read.
    # The model is on cuda:1, the current device 0: events go on cuda:1's current stream.
    torch = pytest.importorskip("torch")
    from pyfastensor.plan import record

    clock, synced = [0.0], []

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            self.at, self.done = None, False

        def record(self, stream: object = None) -> None:
            assert stream == "current stream of cuda:1", stream
            clock[0] += 0.25
            self.at = clock[0]

        def synchronize(self) -> None:
            self.done = True

        def elapsed_time(self, end: object) -> float:
            assert end.done, "read before the end event was waited for"
            return end.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"current stream of {device}")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(record, "_device_of", lambda model, batch: torch.device("cuda", 1))
    t = record.record_trace(*_tiny_step())
    _check_consistent(t)
    assert {o.time_ns for o in t.ops} == {250_000}
    assert t.meta == {"op_time": "cuda_events", "device": "cuda:1", "device_name": "Fake GPU"}
    assert synced == [torch.device("cuda", 1)]  # the warm step's work waited for before the first op


def test_record_marks_saved_tensors_and_gradients():
    torch = pytest.importorskip("torch")
    from torch import nn

    from pyfastensor.plan import record_trace

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    t = record_trace(model, (x, y), lambda m, x, y: nn.functional.cross_entropy(m(x), y))
    _check_consistent(t)
    by_kind: dict[str, list[int]] = {}
    for tensor in t.tensors:
        by_kind.setdefault(tensor.kind, []).append(tensor.bytes)
    params = sorted(p.numel() * 4 for p in model.parameters())
    assert sorted(by_kind["weight"]) == params
    # Adam keeps exp_avg and exp_avg_sq per parameter, and a step count.
    assert sorted(b for b in by_kind["optimizer"] if b > 4) == sorted(params * 2)
    # The ReLU's output (8 x 64 floats) is saved for backward: ReLU's and the second Linear's.
    assert 8 * 64 * 4 in by_kind["activation"]
    # Each parameter's gradient has the parameter's size.
    assert set(params) <= set(by_kind["gradient"])
    # A transpose is a view: it reads the weight and writes nothing.
    t_ops = [o for o in t.ops if o.name == "fwd.t"]
    assert t_ops and all(o.writes == () for o in t_ops)
    # The planner works on it.
    peak = plan.simulate(t, Hardware.g10_default(), "ideal").peak_device_bytes
    hw = Hardware.g10_default().replace(device_bytes=peak * 2 // 3)
    assert plan.simulate(t, hw, "g10").peak_device_bytes <= hw.device_bytes


def test_bench_plan_tiny(tmp_path, capsys):
    pytest.importorskip("torch")
    args = ["plan", "--no-g10", "--models", "bert,resnet", "--batches", "2", "--demands", "150%,3",
            "--layers", "1", "--width", "bert=16,resnet=8", "--no-plot", "--json", str(tmp_path / "r.json"),
            "--traces", str(tmp_path / "traces")]
    assert main(args) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("model"))
    for policy in plan.policies():
        assert policy in header.split()
    rows = [line.split() for line in out.splitlines() if line.startswith(("bert ", "resnet "))]
    assert [(r[0], r[1], r[2]) for r in rows] == [("bert", "2", "150%"), ("bert", "2", "300%"),
                                                  ("resnet", "2", "150%"), ("resnet", "2", "300%")]
    assert "target: g10 >= 90% of ideal on average" in out
    assert "target: g10 >= 1.3x flashneuron" in out
    result = json.loads((tmp_path / "r.json").read_text())
    settings = result["settings"]
    assert settings["width"] == {"bert": 16, "resnet": 8}
    # --speedup auto: the A100's FP32 peak over this CPU's measured rate
    assert settings["cpu_flops"] > 0
    assert settings["speedup"] == pytest.approx(19.5e12 / settings["cpu_flops"])
    assert "measured" in out
    for r in result["rows"]:
        assert r["throughput"]["ideal"] == 1.0
        assert r["device_bytes"] == int(r["peak_bytes"] / r["demand"])
        assert all(0 <= v <= 1 for v in r["throughput"].values())
    for r in result["rows"]:  # the bound is the most any policy reaches; 0 where one op does not fit
        assert 0 <= r["bound"] <= 1
        assert (r["bound"] == 0) == ("g10" in r["errors"])
        assert all(v <= r["bound"] + 1e-9 for p, v in r["throughput"].items() if p != "ideal")
    for r in rows:  # a number per policy, or the word infeasible, then the bound, then g10 over flashneuron
        assert len(r) == 5 + len(plan.policies()) + 2
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == ["bert-b2.json", "resnet-b2.json"]


def test_bench_plan_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks import plan as bench_plan

    rows = [{"model": "bert", "batch": 2, "demand": 2.0,
             "throughput": {"ideal": 1.0, "on_demand": 0.5, "flashneuron": 0.4, "g10": 0.9}}]
    png = bench_plan.plot({"rows": rows, "settings": {"speedup": 1.0}}, tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_plan_runtime_tiny(tmp_path):
    pytest.importorskip("torch")
    from benchmarks import plan as bench_plan
    from benchmarks.workloads import TrainWorkload as Workload
    from benchmarks.workloads import conv_net, deep_mlp

    models = [(Workload("mlp", deep_mlp(64, 3), (64,)), 256), (Workload("cnn", conv_net(4, 2), (3, 32, 32)), 8)]
    result = bench_plan.run_runtime(tmp_path, rounds=2, warmup=2, min_size=16 << 10, models=models)
    assert list(tmp_path.iterdir()) == []
    for name, m in result["models"].items():
        rows = m["rows"]
        assert tuple(rows) == bench_plan.RUNTIME_ROWS
        assert m["budget"] == int(m["none_peak"] * 0.5)
        for r in rows.values():
            assert len(r["step_ms"]) == 2 and r["min"] <= r["median"] <= r["max"]
        assert rows["none"]["x_none"] == {"median": 1.0, "min": 1.0, "max": 1.0}
        planned = rows["planned"]
        assert planned["peak_bytes"] <= m["budget"], name
        assert set(planned["tiers"]) <= {"stay", "ssd"} and sum(planned["tiers"].values()) == m["none_peak"]
        assert planned["x_scheduled"]["min"] <= planned["x_scheduled"]["max"]
    text = bench_plan.format_runtime(result)
    assert "target: planned <= 1.00x scheduled" in text and "target: planned <= 1.10x no offload" in text
    for row in bench_plan.RUNTIME_ROWS:
        assert f"  {row} " in text


def test_bench_plan_help_names_the_runtime_part():
    out = subprocess.run([sys.executable, "-m", "benchmarks", "plan", "--help"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert "--runtime" in out and "--runtime-only" in out and "--rounds" in out


G10_TRACES = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "g10", "traces")


@pytest.mark.skipif(not os.path.isdir(G10_TRACES), reason="G10's traces are not beside this checkout")
@pytest.mark.parametrize("name", sorted(n.removesuffix(".json.gz") for n in os.listdir(G10_TRACES)
                                        if n.endswith(".json.gz")) if os.path.isdir(G10_TRACES) else [])
def test_g10_traces_more_resources_not_slower(name):
    # More device memory, host memory, faster links, a faster SSD or a faster host link: never
    # slower (zero tolerance; MakePlan's candidates only grow with the hardware).
    t = Trace.load(os.path.join(G10_TRACES, f"{name}.json.gz"))
    hw = Hardware.g10_artifact()
    base = plan.simulate(t, hw, "g10")
    assert base.feasible and base.peak_device_bytes <= hw.device_bytes
    more = [hw.replace(device_bytes=hw.device_bytes + (8 << 30)), hw.replace(host_bytes=2 * hw.host_bytes),
            hw.replace(ssd_read_bps=1.25 * hw.ssd_read_bps, ssd_write_bps=1.25 * hw.ssd_write_bps,
                       host_link_bps=1.25 * hw.host_link_bps),
            hw.replace(ssd_read_bps=2 * hw.ssd_read_bps, ssd_write_bps=2 * hw.ssd_write_bps),
            hw.replace(host_link_bps=2 * hw.host_link_bps)]
    for h in more:
        assert plan.simulate(t, h, "g10").time_ns <= base.time_ns, h


def test_bench_plan_on_g10_traces(tmp_path, capsys):
    """The first section: G10's own traces against G10's published figures, a table, JSON and a PNG."""
    from benchmarks import plan_g10

    assert len(plan_g10.workloads()) == 25  # every trace in the repository has G10's published figure
    small = "BERT_Base/128,VIT/256,BERT_Base/512"
    args = ["plan", "--g10-only", "--g10-workloads", small, "--json", str(tmp_path / "r.json"),
            "--g10-plot", str(tmp_path / "g10.png")]
    assert main(args) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "r-g10.json").read_text())
    assert [r["workload"] for r in result["rows"]] == small.split(",")
    for r in result["rows"]:
        assert 0 < r["g10"] <= r["bound"] + 1e-9 and r["peak_rss_bytes"] > 0 and r["plan_s"] > 0
        assert r["met"] == (r["g10"] >= r["published"] - 1e-9)
        line = next(x for x in out.splitlines() if x.startswith(r["workload"] + " "))
        assert line.split()[1:4] == [f"{r['g10']:.3f}", f"{r['published']:.3f}", f"{r['bound']:.3f}"]
    bert512 = result["rows"][2]
    assert bert512["published"] == pytest.approx(0.670, abs=1e-3)  # G10's figure, from published.json
    assert bert512["target"] == pytest.approx((bert512["published"] + bert512["bound"]) / 2)
    assert "targets: g10 >= G10's published prefetch_lru on" in out
    assert (tmp_path / "g10.png").read_bytes()[:4] == b"\x89PNG"
    assert "small models recorded on this CPU" not in out  # --g10-only


def test_bench_plan_sensitivity_on_g10_traces():
    from benchmarks import plan_g10

    s = plan_g10._sensitivity("VIT/1280", str(plan_g10.TRACES))  # a workload the links bound
    ssd = [s["ssd"][str(b)] for b in plan_g10.SSD_BPS]
    host = [s["host"][str(h)] for h in plan_g10.HOST_BYTES]
    assert all(0 < v <= 1 for v in ssd + host)
    assert ssd == sorted(ssd) and host == sorted(host)  # more bandwidth, more host memory: not slower here
    assert ssd[0] < ssd[-1] and host[0] < host[-1]  # and each sweep moves the figure
