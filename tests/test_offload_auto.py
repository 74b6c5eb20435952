"""policy="auto": each saved tensor kept, moved or recomputed within a budget; recomputation exact."""

from __future__ import annotations

import contextlib
import copy
import re
import types
import warnings

import pytest
import torch
from offload_models import assert_same_grads, gpt_inputs, inputs, loss_of, train
from torch.utils.checkpoint import checkpoint

import pyfastensor
import pyfastensor.offload._auto as auto

STEPS = 5  # a warm-up step, the profiling step, three steps under the plan


@pytest.fixture
def recompute_all(monkeypatch):
    """The planner's plan, with every tensor that has a recipe recomputed: what recomputation
    must get right, whatever this machine's timings make the planner choose."""
    real = auto.plan_mix

    def plan(mix):
        p = real(mix)
        for d, t in zip(p["decisions"], mix["tensors"], strict=True):
            if t["recompute_ns"] >= 0:
                d["action"] = "recompute"
        return p

    monkeypatch.setattr(auto, "plan_mix", plan)


def _off(tmp_path, model, budget, **kw):
    # No module=: train() trains a copy; the parameters are told apart as the forward runs them.
    return pyfastensor.offload(policy="auto", budget=budget, tier="ssd", spill_dir=str(tmp_path), min_size=4 << 10,
                               **kw)


def _frontier(tmp_path, model, batch_of, forward_ctx=None):
    """The plan's frontier for ``model``: a run with a budget no mix needs."""
    off = _off(tmp_path, model, 1 << 40)
    train(model, batch_of, 3, lambda: off, forward_ctx)
    details = off.plan_details
    off.close()
    return details


@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt", "gpt-bf16", "blocks"])
def test_gradients_are_bit_identical_with_every_recipe_recomputed(tmp_path, name, recompute_all):
    """Dropout (random draws kept, never drawn again), in-place ReLUs, tied weights, bf16 autocast
    (its casts replayed as recorded), attention: the same gradients and weights, bit for bit."""
    forward_ctx = None
    if name.startswith("gpt"):
        model, batch_of = gpt_inputs()
        if name == "gpt-bf16":
            def forward_ctx():
                return torch.autocast("cpu", dtype=torch.bfloat16)
    else:
        model, batch_of = inputs(name)
    want = train(model, batch_of, STEPS, None, forward_ctx)
    off = _off(tmp_path, model, 1 << 40)
    got = train(model, batch_of, STEPS, lambda: off, forward_ctx)
    s = off.summary()
    off.close()
    assert_same_grads(want, got)
    assert s.recomputed_tensors > 0 and s.recompute_bytes > 0, str(s)


@pytest.fixture
def one_profile(monkeypatch):
    """Every plan made from the first profile taken (its measured times), whatever the budget:
    the plans of several budgets then differ by the budget alone, as one run's would."""
    real, first = auto.make, {}

    def make(graph, rec, budget, tier, hook_ns=None, kept=frozenset()):
        mix, entries, recipes = real(graph, rec, budget, tier, hook_ns, kept)
        first.setdefault("times", ([t["recompute_ns"] for t in mix["tensors"]], mix["compute_ns"], mix["tiers"],
                                   mix["hook_ns"]))
        times = first["times"]
        for t, ns in zip(mix["tensors"], times[0], strict=True):
            t["recompute_ns"] = ns
        mix["compute_ns"], mix["tiers"], mix["hook_ns"] = times[1], times[2], times[3]
        return mix, entries, recipes

    monkeypatch.setattr(auto, "make", make)
    monkeypatch.setattr(auto, "CALIBRATION_SKIP", 1 << 30)  # and no calibration to change them


def test_the_plan_keeps_its_budget_and_the_peak_never_rises_as_the_budget_drops(tmp_path, one_profile):
    model, batch_of = inputs("blocks")
    want = train(model, batch_of, STEPS)
    frontier = _frontier(tmp_path, model, batch_of)
    top, low = frontier["frontier"][0]["peak_bytes"], frontier["min_budget"]
    assert low < top
    largest = max(t.numel() * t.element_size() for t in _saved_of(model, batch_of))
    peaks, predicted = [], []
    for budget in (top, (2 * top + low) // 3, (top + 2 * low) // 3, low):
        off = _off(tmp_path, model, budget)
        got = train(model, batch_of, STEPS, lambda off=off: off)
        s = off.summary()
        off.close()
        assert_same_grads(want, got)
        assert s.predicted_peak_bytes <= budget
        # The plan is simulated between the hooks: what backward reads and makes again meets what
        # autograd lets go between them, by up to one saved tensor.
        assert s.resident_peak_bytes <= budget + largest, f"budget {budget}: {s}"
        if budget == top:  # a plan that keeps everything: the step runs without hooks, as without offload
            assert s.saved_tensors == 0 and s.resident_peak_bytes == 0, str(s)
        else:
            peaks.append(s.resident_peak_bytes)
        predicted.append(s.predicted_peak_bytes)
    assert predicted == sorted(predicted, reverse=True), predicted
    assert peaks == sorted(peaks, reverse=True), peaks


def test_a_link_slower_than_the_forward_meets_a_budget_by_waiting_for_writes(tmp_path, monkeypatch):
    """A store that writes slower than the forward makes saved tensors (here a 1 kB/s link, as the
    planner is told, and moves only): at the end of the forward every moved tensor is still being
    written, so no mix lowers the peak by itself. A budget below it is met as the runtime meets it,
    each pack waiting for the writes before it: the plan says how long, the resident peak stays
    within the budget, and gradients are bit-identical."""
    real = auto.make

    def slow(*args, **kw):
        mix, entries, recipes = real(*args, **kw)
        for t in mix["tensors"]:
            t.update(recompute_ns=-1, sources=[], temp_bytes=0)
        for link in mix["tiers"].values():
            link.update(write_bps=1e3, read_bps=1e3)
        return mix, entries, recipes

    monkeypatch.setattr(auto, "make", slow)
    monkeypatch.setattr(auto, "CALIBRATION_SKIP", 1 << 30)  # the link stays as slow as it was told
    model, batch_of = inputs("mlp")
    want = train(model, batch_of, STEPS)
    frontier = _frontier(tmp_path, model, batch_of)
    top, lowest = frontier["frontier"][0]["peak_bytes"], min(p["peak_bytes"] for p in frontier["frontier"])
    assert lowest == top, "no mix without waits lowers the peak"
    assert frontier["min_budget"] < top // 2, frontier["text"]
    budget = top // 2
    off = _off(tmp_path, model, budget)
    got = train(model, batch_of, STEPS, lambda: off)
    s, details = off.summary(), off.plan_details
    off.close()
    assert_same_grads(want, got)
    assert details["wait_ns"] > 0 and "waits" in details["text"], details["text"]
    assert s.predicted_peak_bytes <= budget and s.offloaded_tensors > 0, str(s)
    largest = max(t.numel() * t.element_size() for t in _saved_of(model, batch_of))
    assert s.resident_peak_bytes <= budget + largest, str(s)


def test_what_one_backward_node_unpacks_is_held_until_the_node_is_done(tmp_path, monkeypatch):
    """A backward node holds every saved tensor it unpacks until its compute is done (a matmul's
    backward reads both its inputs; a compiled region's node takes all its saved tensors at once
    and reads them in kernels no op shows): in the profile, each is used until that node's last
    unpack, after which the node's compute is measured."""
    seen = {}
    real = auto.make

    def make(*args, **kw):
        seen["mix"], entries, recipes = real(*args, **kw)
        return seen["mix"], entries, recipes

    monkeypatch.setattr(auto, "make", make)

    class MatmulOfTwo(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

        def forward(self, x):
            return self.a(x).t() @ self.b(x).sin()

    model = MatmulOfTwo()
    off = pyfastensor.offload(policy="auto", budget=1 << 40, tier="ssd", spill_dir=str(tmp_path), min_size=4 << 10,
                              module=model)
    for _ in range(3):
        with off:
            model(torch.randn(256, 64)).sum().backward()
    off.close()
    used = sorted(t["uses"] for t in seen["mix"]["tensors"] if t["uses"])
    first, second = used[0], used[1]  # the matmul's inputs: backward's first node unpacks them
    assert first == [first[0], second[0]] and second == [second[0]], used


def _saved_of(model, batch_of):
    """The tensors one step of ``model`` saves for backward."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        loss_of(model, *batch_of(0))
    return saved


@pytest.mark.parametrize("budget", [0, 1])
def test_a_budget_below_any_mix_is_refused_naming_the_smallest(tmp_path, budget, one_profile):
    model, batch_of = inputs("mlp")
    off = _off(tmp_path, model, budget)
    with pytest.raises(pyfastensor.InvalidArgumentError, match=r"smallest feasible budget is (\d+) bytes") as e:
        train(model, batch_of, STEPS, lambda: off)
    smallest = int(re.search(r"smallest feasible budget is (\d+) bytes", str(e.value)).group(1))
    with pytest.raises(pyfastensor.InvalidArgumentError):  # and again at every entry
        with off:
            pass
    off.close()
    ok = _off(tmp_path, model, smallest)
    train(model, batch_of, STEPS, lambda: ok)
    assert ok.summary().resident_peak_bytes <= smallest
    ok.close()


def test_a_step_that_is_not_the_profiled_one_is_stored_and_profiled_again(tmp_path, recompute_all):
    model, batch_of = inputs("mlp")

    def batches(i):  # from step 3 on, another batch size: other tensors at the same pack indices
        x, y = batch_of(i)
        return (x[:16], y[:16]) if i >= 3 else (x, y)

    want = train(model, batches, 7)
    off = _off(tmp_path, model, 1 << 40)
    with pytest.warns(UserWarning, match="not the profiled one"):
        got = train(model, batches, 7, lambda: off)
    assert_same_grads(want, got)
    assert off.summary().recomputed_tensors > 0, "profiled again and planned for the new shapes"
    off.close()


def test_a_parameter_changed_before_backward_is_refused(tmp_path, recompute_all):
    model, batch_of = inputs("mlp")
    off = _off(tmp_path, model, 1 << 40)
    for i in range(3):
        with off:
            loss_of(model, *batch_of(i)).backward()
    x, y = batch_of(3)
    with off:
        loss = loss_of(model, x, y)
        with torch.no_grad():
            model.net[0].weight.add_(1.0)
        with pytest.raises(RuntimeError, match="changed in place between the forward and this backward"):
            loss.backward()
    off.close()


def test_plan_and_summary_say_what_is_predicted_beside_what_is_measured(tmp_path, one_profile):
    model, batch_of = inputs("blocks")
    frontier = _frontier(tmp_path, model, batch_of)
    budget = (frontier["frontier"][0]["peak_bytes"] + frontier["min_budget"]) // 2
    off = _off(tmp_path, model, budget)
    train(model, batch_of, STEPS, lambda: off)
    text, details, s = off.plan(), off.plan_details, off.summary()
    off.close()
    assert "predicted step" in text and "smallest feasible" in text
    assert details["peak_bytes"] <= budget
    classes = details["classes"]
    assert sum(c["tensors"] for c in classes.values()) == len(details["decisions"])
    assert s.predicted_step_seconds > 0 and s.step_seconds > 0
    assert s.predicted_peak_bytes == details["peak_bytes"]
    assert "predicted" in str(s)


@pytest.mark.parametrize("budget", [1 << 40, 1])
def test_the_profiling_step_keeps_what_fits_the_budget_and_moves_one_in_four(tmp_path, budget):
    """The profiling step moves the first of every four saved storages (the store's speeds are
    measured on them) and whatever does not fit the budget; the rest it keeps (moving
    everything, as the warm-up step does, would cost what policy="all" costs)."""
    model, batch_of = inputs("blocks")
    off = _off(tmp_path, model, budget)
    train(model, batch_of, 2, lambda: off)  # the warm-up step, the profiling step
    s = off.summary()
    off.close()
    entries = s.offloaded_tensors + s.resident_tensors
    assert entries > 4, str(s)
    moved = -(-entries // auto.PROFILE_SAMPLE) if budget > 1 else entries
    assert s.offloaded_tensors == moved, str(s)


def test_the_plan_is_calibrated_on_the_median_of_its_steps_not_on_one_slowed_step(tmp_path):
    """The first step under the plan is left out (one-time costs); the median of the next three
    scales the profile: one step slowed tenfold by something else does not."""
    model, batch_of = inputs("mlp")
    off = _off(tmp_path, model, 1 << 40)
    train(model, batch_of, 3, lambda: off)  # the warm-up step, the profiling step, the first under the plan
    policy = off._policy
    predicted = off.plan_details["step_ns"] / 1e9
    for slow in (1.2, 12.0, 1.2):
        assert off.plan_details["calibration"] == 1.0, "calibrated before its third timed step"
        policy.stepped(types.SimpleNamespace(step_seconds=predicted * slow, offloaded_tensors=0))
    calibrated = off.plan_details
    off.close()
    assert calibrated["calibration"] == pytest.approx(1.2, rel=1e-6)
    assert calibrated["step_ns"] > predicted * 1e9


def test_a_plan_the_calibrated_profile_no_longer_fits_is_kept_and_simulated_again(tmp_path, monkeypatch):
    """Calibration plans again over the scaled profile; where that refuses the budget (the
    smallest feasible one moved), the plan keeps its decisions, and its step is the one they take
    over the scaled profile, not the stale prediction."""
    model, batch_of = inputs("mlp")
    off = _off(tmp_path, model, 1 << 40)
    train(model, batch_of, 3, lambda: off)
    policy, before = off._policy, off.plan_details
    real = auto.plan_mix

    def refuse_a_new_choice(mix):
        if "actions" not in mix:
            raise pyfastensor.InvalidArgumentError("a budget of 1 bytes is below what any mix reaches")
        return real(mix)

    monkeypatch.setattr(auto, "plan_mix", refuse_a_new_choice)
    for _ in range(auto.CALIBRATION_SKIP + auto.CALIBRATION_STEPS):
        policy.stepped(types.SimpleNamespace(step_seconds=before["step_ns"] / 1e9 * 2, offloaded_tensors=0))
    after = off.plan_details
    off.close()
    assert after["calibration"] == pytest.approx(2.0, rel=1e-6)
    assert [d["action"] for d in after["decisions"]] == [d["action"] for d in before["decisions"]]
    assert after["step_ns"] == pytest.approx(2 * before["step_ns"], rel=0.05), (before["step_ns"], after["step_ns"])


def test_a_users_own_checkpointing_composes(tmp_path, recompute_all):
    model, batch_of = inputs("blocks")
    blocks = list(model)

    class Checkpointed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(blocks)

        def forward(self, x):
            x = checkpoint(self.blocks[0], x, use_reentrant=False)
            return self.blocks[1](x)

    wrapped = Checkpointed()
    want = train(wrapped, batch_of, STEPS)
    off = _off(tmp_path, wrapped, 1 << 40)
    got = train(wrapped, batch_of, STEPS, lambda: off)
    off.close()
    assert_same_grads(want, got)


def test_a_retained_graph_backpropagates_twice(tmp_path, recompute_all):
    model, batch_of = gpt_inputs()
    off = _off(tmp_path, model, 1 << 40)
    train(model, batch_of, 3, lambda: off)
    ids, targets = batch_of(7)
    ref = [p.detach().clone() for p in model.parameters()]
    del ref
    torch.manual_seed(5)
    loss = loss_of(model, ids, targets)
    loss.backward(retain_graph=True)
    loss.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.manual_seed(5)
    with off:
        loss = loss_of(model, ids, targets)
        loss.backward(retain_graph=True)
        loss.backward()
    assert off.summary().recomputed_tensors > 0
    for a, p in zip(want, model.parameters(), strict=True):
        assert torch.equal(a, p.grad)
    off.close()


def test_options_refused_with_auto():
    with pytest.raises(ValueError, match="needs budget="):
        pyfastensor.offload(policy="auto")
    with pytest.raises(ValueError, match="compression must be None"):
        pyfastensor.offload(policy="auto", budget=1 << 20, compression="fp16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pyfastensor.offload(policy="auto", budget=1 << 20).close()


def test_a_plan_made_on_one_model_is_not_applied_to_anothers_parameters(tmp_path, recompute_all):
    """The recipes read parameters: those of the modules the step runs, never the profiled model's
    when another model of the same shapes runs instead."""
    model, batch_of = inputs("mlp")
    off = _off(tmp_path, model, 1 << 40)
    train(model, batch_of, 3, lambda: off)  # profiled and planned on a copy of model
    other, _ = inputs("mlp")
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-1)
    want = train(other, batch_of, 2)
    got = train(other, batch_of, 2, lambda: off)
    off.close()
    assert_same_grads(want, got)


def test_parameters_swapped_between_modules_are_read_where_the_step_uses_them(tmp_path, recompute_all):
    """A recipe finds its parameters where autograd has them, not by address: two biases of the
    same shape swapped between layers keep their addresses, each now in the other's place."""
    model, batch_of = inputs("mlp")
    off = _off(tmp_path, model, 1 << 40)
    for i in range(3):
        with off:
            loss_of(model, *batch_of(i)).backward()
    first, second = model.net[0].bias, model.net[2].bias
    model.net[0].bias, model.net[2].bias = second, first
    model.zero_grad()
    plain = copy.deepcopy(model)
    loss_of(plain, *batch_of(3)).backward()
    with off:
        loss_of(model, *batch_of(3)).backward()
    assert off.summary().recomputed_tensors > 0, str(off.summary())
    off.close()
    for (name, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name


def test_cuda_tensors_through_the_host_tier_under_the_plan(tmp_path, monkeypatch):
    """Moved tensors staged as CUDA ones are (the fake CUDA backend: pinned buffers, a side stream
    whose copies land only once waited for), beside recomputed ones: bit-identical gradients."""
    from cuda_fakes import FakeCuda, fake_offload

    real = auto.plan_mix

    def plan(mix):  # half the recipes recomputed, every other tensor moved to the host tier
        p = real(mix)
        for k, (d, t) in enumerate(zip(p["decisions"], mix["tensors"], strict=True)):
            d["action"] = "recompute" if t["recompute_ns"] >= 0 and k % 2 else "host"
        return p

    monkeypatch.setattr(auto, "plan_mix", plan)
    model, batch_of = inputs("blocks")
    want = train(model, batch_of, STEPS)
    fake = FakeCuda()
    off = fake_offload(fake, tmp_path, None, policy="auto", budget=1 << 40, tier="host")
    got = train(model, batch_of, STEPS, lambda: off)
    s = off.summary()
    off.close()
    assert_same_grads(want, got)
    assert s.recomputed_tensors > 0 and s.offloaded_tensors > 0, str(s)
    assert s.pinned_allocations == 0, "the pinned pool was sized before the plan's steps"


def test_blocks_compiled_one_by_one_compose(tmp_path, recompute_all):
    """torch.compile per block: what a compiled block saves is kept or moved (its kernels are not
    aten ops to replay), what the eager code between blocks saves may be recomputed."""
    model, batch_of = inputs("blocks")
    want = train(model, batch_of, STEPS)
    compiled = copy.deepcopy(model)
    compiled[0].compile(backend="aot_eager")  # the first block compiled, the second eager
    got_want = train(compiled, batch_of, STEPS)
    off = _off(tmp_path, compiled, 1 << 40)
    got = train(compiled, batch_of, STEPS, lambda: off)
    s = off.summary()
    off.close()
    assert_same_grads(got_want, got)
    assert_same_grads(want, got_want)
    assert s.recomputed_tensors > 0, "the eager block's tensors are recomputed"


def test_what_inductors_generated_code_makes_is_never_replayed(tmp_path, recompute_all):
    """Code inductor generates calls a few aten ops (extern kernels, fallbacks) and then writes
    into their outputs with fused kernels that no aten op shows. A stand-in: a module named as
    inductor names what it generates, whose ``call`` writes into an op's output through numpy
    (no aten op, no version bump). Replaying the op would give the bytes before that write."""
    gen = types.ModuleType("torch._inductor.runtime.compile_tasks.cpyfastensortest")
    exec("import torch\n"
         "def call(h):\n"
         "    y = torch.ops.aten.mul.Tensor(h, 2.0)\n"
         "    y.detach().numpy()[:] += 1.0  # a fused kernel writing in place\n"
         "    return y\n", gen.__dict__)
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 256)
    x = torch.randn(128, 64)

    def grads(ctx):
        lin.zero_grad()
        with ctx:
            torch.sin(gen.call(lin(x))).sum().backward()  # sin saves y
        return [lin.weight.grad.clone(), lin.bias.grad.clone()]

    want = grads(contextlib.nullcontext())
    off = _off(tmp_path, None, 1 << 40)
    got = [grads(off) for _ in range(STEPS)]
    classes = off.plan_details["classes"]
    off.close()
    assert_same_grads([want] * STEPS, got)
    assert "recompute" not in classes, classes


def test_a_source_changed_in_place_before_backward_is_refused(tmp_path, recompute_all):
    """A tensor a recipe reads, changed in place between forward and backward: the recompute
    would read other bytes, so backward raises, naming the change."""
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(x):
        h = lin1(x)  # saved by gelu; recomputable from x
        return lin2(torch.nn.functional.gelu(h)), h

    off = _off(tmp_path, None, 1 << 40)
    for _ in range(3):
        with off:
            out, _ = forward(torch.randn(128, 64))
            out.sum().backward()
    with off:
        out, h = forward(torch.randn(128, 64))
        with torch.no_grad():
            h.add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation|changed in place"):
            out.sum().backward()
    off.close()
