"""The whole training step (forward, losses, backward, optimiser) compiles with torch.compile(fullgraph=True): no
graph break, no recompile over five steps, and the compiled steps move the heads as the eager ones do. On a GPU the
step captured as CUDA graphs ends with the same heads as the eager step."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch._dynamo as dynamo

from mr2probe.heads import ProbeConfig
from mr2probe.methods import METHODS
from mr2probe.trainer import StackTraining, TrainConfig, TrainData, expand_runs, train_stack

K, D, B = 6, 5, 8
NO_ADAPTER = [n for n in METHODS.names() if not METHODS.get(n).needs_adapter]


def build(methods: list[str], head: str, adapter: str, device: str = "cpu"):
    g = torch.Generator().manual_seed(0)
    y = (torch.arange(48) % K).to(device)
    x = (torch.randn(48, D, generator=g).to(device) + y[:, None])
    data = TrainData(x, y, x[:12], y[:12], K)
    cfg = TrainConfig(batch_size=B, progress=False, probe=ProbeConfig(head=head, adapter=adapter, width=4))
    run = StackTraining(data, sorted(expand_runs(methods, [0], cfg), key=lambda s: s.method), cfg, lambda m: None,
                        3, "test", "acc")
    run.start_epoch(1)
    return data, run.probe, run.step_loss, run.opt


def batches(data: TrainData, n: int):
    for i in range(n):
        idx = torch.arange(i * B, (i + 1) * B, device=data.y.device) % len(data.y)
        yield data.x.index_select(0, idx), data.y.index_select(0, idx), idx


def run(methods: list[str], head: str, adapter: str, compiled: bool) -> tuple[list[torch.Tensor], int]:
    """Five steps, compiled (fullgraph, aot_eager: the graph dynamo traces, without code generation) or eager;
    returns the parameters after them and the number of frames dynamo compiled."""
    data, probe, step, opt = build(methods, head, adapter)
    fn = step.train_step
    dynamo.reset()
    counters = dynamo.utils.counters
    counters.clear()
    if compiled:
        fn = torch.compile(step.train_step, fullgraph=True, dynamic=False, backend="aot_eager")
    with dynamo.config.patch(trace_autograd_ops=True, error_on_recompile=True):
        for xb, yb, idx in batches(data, 5):
            loss = fn(opt, xb, yb, idx)
            assert torch.isfinite(loss)
    return [p.detach().clone() for p in probe.parameters()], int(counters["stats"]["unique_graphs"])


CASES = [(NO_ADAPTER, "linear", "none"), (NO_ADAPTER, "cosine", "none")]


@pytest.mark.parametrize("methods,head,adapter", CASES, ids=["18-linear", "18-cosine"])
def test_the_whole_step_compiles_in_one_graph_without_recompiles(methods, head, adapter) -> None:
    data, probe, step, opt = build(methods, head, adapter)
    xb, yb, idx = next(batches(data, 1))
    dynamo.reset()
    with dynamo.config.patch(trace_autograd_ops=True):
        explained = dynamo.explain(step.train_step)(opt, xb, yb, idx)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    assert explained.graph_count == 1
    got, graphs = run(methods, head, adapter, compiled=True)  # error_on_recompile: a recompile raises
    assert graphs == 1
    want, _ = run(methods, head, adapter, compiled=False)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_with_an_adapter_the_whole_step_compiles_in_one_graph() -> None:
    """Every method, SupCon and MR2's representation term included (its dense layout under compile)."""
    got, graphs = run(METHODS.names(), "linear", "linear", compiled=True)
    assert graphs == 1
    want, _ = run(METHODS.names(), "linear", "linear", compiled=False)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_the_trainer_with_compile_on_trains_the_heads_of_the_eager_trainer(monkeypatch) -> None:
    """``compile=on`` in the trainer (inductor on this machine's CPU): the same heads within float32 rounding, the
    last smaller batch of each epoch included."""
    data, *_ = build(["ce", "mr2", "group_dro"], "linear", "none")
    cfg = TrainConfig(epochs=2, batch_size=10, min_steps=0, progress=False, lr=(1e-2,), wd=(1e-4,))
    specs = expand_runs(["ce", "mr2", "group_dro"], [0], cfg)
    eager = train_stack(data, specs, cfg)
    dynamo.reset()
    compiled = train_stack(data, specs, replace(cfg, compile="on"))
    for k, v in eager.probe.state_dict().items():
        torch.testing.assert_close(compiled.probe.state_dict()[k], v, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_captured_step_ends_with_the_eager_heads() -> None:
    data, *_ = build(NO_ADAPTER, "linear", "none", device="cuda")
    cfg = TrainConfig(epochs=2, batch_size=B, min_steps=0, progress=False, device="cuda", tf32=False)
    specs = expand_runs(NO_ADAPTER, [0], cfg)
    eager = train_stack(data, specs, replace(cfg, compile="off"))
    graphed = train_stack(copy.copy(data), specs, replace(cfg, compile="on", cuda_graph=True))
    for k, v in eager.probe.state_dict().items():
        torch.testing.assert_close(graphed.probe.state_dict()[k], v, rtol=1e-4, atol=1e-5)


def test_a_step_the_compiler_fails_on_trains_eagerly_and_says_so(monkeypatch) -> None:
    """Compilation happens before the step runs: where it fails, the stack logs one line and trains eagerly, to the
    same heads as ``compile=off``."""
    def failing(fn, **kwargs):
        def run(*args):
            raise dynamo.exc.InternalTorchDynamoError("the compiler failed here")
        return run

    data, *_ = build(["ce", "group_dro"], "linear", "none")
    cfg = TrainConfig(epochs=1, batch_size=10, min_steps=0, progress=False, lr=(1e-2,), wd=(1e-4,))
    specs = expand_runs(["ce", "group_dro"], [0], cfg)
    eager = train_stack(data, specs, cfg)
    monkeypatch.setattr(torch, "compile", failing)
    said: list[str] = []
    fell_back = train_stack(data, specs, replace(cfg, compile="on"), log=said.append)
    assert len([m for m in said if "compiler failed" in m]) == 1
    for k, v in eager.probe.state_dict().items():
        assert torch.equal(fell_back.probe.state_dict()[k], v)
