"""What one stacked training step dispatches, by phase: ops, bytes per logit element, bytes per parameter, host syncs.

Counted with a ``TorchDispatchMode`` over one step of the trainer's own code (``StackStep``, backward,
``StackedAdamW.step``), after two warm-up steps:
  ops        aten ops that run a kernel (≈ kernel launches on a GPU); views and other metadata-only ops
             (view, transpose, select, unbind, …) are listed apart, as they launch nothing
  B/logit    bytes read and written by the ops of the loss and backward phases whose largest tensor has the logits'
             H·B·K elements, per logit element; the products (mm, addmm, bmm) excluded (D ≠ B, so the weights'
             H·K·D elements are told apart)
  B/param    bytes read and written by the optimiser phase per trainable parameter
  syncs      ops that make the host wait for the device (item / bool / int reads, nonzero, unique, masked_select)
Phases: bookkeeping (the batch's rows and labels, the divergence flag), forward (the probe), losses, backward,
optimizer. Sizes do not change the counts: K = 1000, B and D small so it runs on a CPU in seconds.

With ``--compiled`` it also compiles the whole step (forward, losses, backward, optimizer) with
torch.compile(fullgraph=True) on this machine's backend and prints inductor's own count of the kernels it generated
and the bytes they access (``torch._inductor.metrics``), per logit element and per parameter.
Usage: python benchmarks/step_ops.py [--k 1000] [--batch 128] [--dim 96] [--compiled]
"""
from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mr2probe.heads import ProbeConfig, ProbeStack
from mr2probe.methods import METHODS, mr2
from mr2probe.optim import StackedAdamW
from mr2probe.trainer import StackStep, StackTraining, TrainConfig, TrainData, expand_runs

PRODUCTS = {"mm", "addmm", "bmm", "baddbmm"}
SYNCS = {"_local_scalar_dense", "nonzero", "unique_consecutive", "_unique2", "unique_dim", "masked_select",
         "item", "is_nonzero"}
FIVE = ["ce", "mr2", "logit_adjust", "group_dro", "class_balanced"]  # 28 heads


class Counting(TorchDispatchMode):
    """Counts the aten ops dispatched under it, by phase, with the bytes each reads and writes."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "bookkeeping"
        self.ops: dict[str, Counter] = defaultdict(Counter)
        self.views: Counter = Counter()
        self.records: list[tuple[str, str, int, int]] = []  # (phase, op, bytes, largest numel)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if _metadata_only(func):
            self.views[self.phase] += 1
            return out
        self.ops[self.phase][name] += 1
        self.records.append((self.phase, name, *_traffic(func, args, kwargs, out)))
        return out


def _metadata_only(func: Any) -> bool:
    """Views and shape-only ops: they launch no kernel."""
    schema = func._schema
    if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        return True
    return func.overloadpacket.__name__ in {"detach", "alias", "lift_fresh", "_to_copy"} and False


def _tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


GATHERS = {"gather", "index_select"}  # read part of their input
SPARSE = {"scatter_add_", "scatter_", "index_put_", "index_add_", "index_copy_", "masked_fill_"}  # touch part of self


def _traffic(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[int, int]:
    """Bytes an op reads (every tensor argument) and writes (its new outputs, and the arguments it mutates: in full,
    except for scatter-like ops, which write as many elements as their source or index holds), and the largest
    tensor's element count."""
    schema = func._schema
    name = func.overloadpacket.__name__
    total, largest, written_ids = 0, 0, set()
    flat_args = list(args) + [kwargs[a.name] for a in schema.arguments[len(args):] if a.name in kwargs]
    others = [t.numel() for a, v in zip(schema.arguments, flat_args) for t in _tensors(v)
              if not (a.alias_info is not None and a.alias_info.is_write)]
    for a, v in zip(schema.arguments, flat_args):
        for t in _tensors(v):
            largest = max(largest, t.numel())
            if a.alias_info is not None and a.alias_info.is_write:
                written_ids.add(id(t))
                touched = min(t.numel(), max(others, default=0)) if name in SPARSE else t.numel()
                total += (1 if a.name == "out" else 2) * touched * t.element_size()  # out=: written, not read
            else:  # a gather reads as many elements as it writes
                read = min(t.numel(), max((o.numel() for o in _tensors(out)), default=0)) if name in GATHERS \
                    else t.numel()
                total += read * t.element_size()
    if name.startswith(("empty", "new_empty")):  # an allocation moves no data
        return 0, largest
    for t in _tensors(out):
        if id(t) not in written_ids:
            total += t.numel() * t.element_size()
        largest = max(largest, t.numel())
    return total, largest


def build(methods: list[str], head: str, adapter: str, k: int, batch: int, dim: int,
          device: torch.device | str = "cpu"):
    """A stack of ``methods`` × their grids (one seed) on synthetic data, set up as the trainer does it
    (:class:`~mr2probe.trainer.StackTraining`), brought to its second epoch: (data, probe, step, optimiser, heads)."""
    g = torch.Generator().manual_seed(0)
    n = max(4 * batch, 2 * k)
    y = (torch.arange(n) % k).to(device)
    x = torch.randn(n, dim, generator=g).to(device)
    data = TrainData(x, y, x[:batch], y[:batch], k)
    cfg = TrainConfig(batch_size=batch, progress=False, probe=ProbeConfig(head=head, adapter=adapter, width=dim))
    specs = sorted(expand_runs(methods, [0], cfg), key=lambda s: s.method)
    run = StackTraining(data, specs, cfg, lambda m: None, 3, "step_ops", "acc")
    run.start_epoch(1)  # LDAM's and CDB's epoch-dependent weights
    return data, run.probe, run.step_loss, run.opt, len(specs)


def one_step(data: TrainData, probe: ProbeStack, step: StackStep, opt: StackedAdamW, batch: int,
             mode: Counting | None = None, finite: torch.Tensor | None = None) -> torch.Tensor:
    """The trainer's step (mr2probe.trainer._train_stack's inner loop) with phase marks."""
    def phase(p: str) -> None:
        if mode is not None:
            mode.phase = p
    phase("bookkeeping")
    idx = torch.arange(batch)
    xb, yb = data.x.index_select(0, idx), data.y.index_select(0, idx)
    phase("forward")
    probe(xb, step.detach)  # counted apart: the losses phase below runs the same forward again, subtracted
    phase("losses")
    loss = step(xb, yb, idx)
    phase("bookkeeping")
    if finite is not None:
        finite &= torch.isfinite(loss)
    phase("backward")
    opt.zero_grad()
    loss.backward()
    phase("optimizer")
    opt.step()
    return loss


def measure(label: str, methods: list[str], head: str, adapter: str, args: argparse.Namespace) -> dict[str, Any]:
    data, probe, step, opt, heads = build(methods, head, adapter, args.k, args.batch, args.dim)
    finite = torch.ones((), dtype=torch.bool)
    for _ in range(2):
        one_step(data, probe, step, opt, args.batch, None, finite)
    mode = Counting()
    with mode:
        one_step(data, probe, step, opt, args.batch, mode, finite)
    fwd = sum(mode.ops["forward"].values())
    by_phase = {p: sum(c.values()) for p, c in mode.ops.items()}
    by_phase["losses"] -= fwd  # the losses phase ran the forward too
    total = sum(v for p, v in by_phase.items() if p != "forward") + fwd
    logit = heads * args.batch * args.k
    logit_bytes = sum(b for p, name, b, big in mode.records
                      if p in ("losses", "backward") and big == logit and name not in PRODUCTS)
    n_params = sum(p.numel() for ps, _, _ in opt.groups for p in ps)
    param_bytes = sum(b for p, _, b, _ in mode.records if p == "optimizer")
    syncs = sum(c for counter in mode.ops.values() for name, c in counter.items() if name in SYNCS)
    top = Counter()
    for p in ("losses", "backward"):
        top.update(mode.ops[p])
    print(f"[{label}] {heads} heads, K={args.k}, B={args.batch}, D={args.dim}: ops/step={total} "
          f"({', '.join(f'{p} {v}' for p, v in by_phase.items())}); views {sum(mode.views.values())}; "
          f"bytes/logit_element={logit_bytes / logit:.1f}; bytes/param={param_bytes / n_params:.1f}; "
          f"host_syncs={syncs}")
    print(f"[{label}]   most dispatched in losses+backward: "
          f"{', '.join(f'{n} {c}' for n, c in top.most_common(8))}")
    return {"ops": total, "syncs": syncs}


def compiled(label: str, methods: list[str], head: str, adapter: str, args: argparse.Namespace) -> None:
    """The whole step under torch.compile(fullgraph=True): inductor's generated kernels and bytes, per step."""
    from torch._dynamo import config as dynamo_config
    from torch._inductor import metrics

    data, probe, step, opt, heads = build(methods, head, adapter, args.k, args.batch, args.dim)
    dynamo_config.trace_autograd_ops = True
    fn = torch.compile(step.train_step, fullgraph=True, dynamic=False)  # the trainer's step (returns the loss detached)
    idx = torch.arange(args.batch)
    xb, yb = data.x.index_select(0, idx), data.y.index_select(0, idx)
    metrics.reset()
    fn(opt, xb, yb, idx)
    kernels, nbytes = metrics.generated_kernel_count, metrics.num_bytes_accessed
    n_params = sum(p.numel() for ps, _, _ in opt.groups for p in ps)
    logit = heads * args.batch * args.k
    print(f"[{label} compiled] generated kernels per step {kernels}; bytes accessed by them per logit element "
          f"{nbytes / logit:.1f} (all phases; per parameter {nbytes / n_params:.1f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--dim", type=int, default=96)  # ≠ batch: the weights [H, K, D] and the logits [H, B, K] differ
    ap.add_argument("--compiled", action="store_true")
    args = ap.parse_args()
    mr2.SYNC_FREE = True  # the representation term's layout of a GPU step (a CPU's ``auto`` may read the batch)
    no_adapter = [n for n in METHODS.names() if not METHODS.get(n).needs_adapter]
    cases = [(f"{len(no_adapter)} methods, linear", no_adapter, "linear", "none"),
             (f"{len(no_adapter)} methods, cosine", no_adapter, "cosine", "none"),
             (f"{len(METHODS.names())} methods, linear adapter", METHODS.names(), "linear", "linear"),
             ("5 methods, linear", FIVE, "linear", "none")]
    for case in cases:
        measure(*case, args)
    if args.compiled:
        compiled(*cases[0], args)


if __name__ == "__main__":
    main()
