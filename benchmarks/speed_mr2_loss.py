"""Speed of one MR2 training step against one CE step, same shapes, same process.

A step = forward (linear adapter D→D + linear head), loss, backward, StackedAdamW update. MR2's step adds
the logit-margin CE and the representation margin loss (same-class distances); its statistics are
recomputed once per epoch, not per step, and are excluded here. Prints one line per K:
    K=1000 mr2/ce=1.23
and the representation term alone (forward + backward) in both same-class layouts of ``rep_margin_loss``
(padded class blocks, pair list) and the one ``auto`` picks.
Usage: python benchmarks/speed_mr2_loss.py [--ks 100,1000] [--batch 512] [--dim 768] [--steps 20]
"""
from __future__ import annotations

import argparse
import time

import torch

from mr2probe.heads import ProbeConfig, ProbeStack
from mr2probe.methods import METHODS, Batch, FitContext, FitData, FitSchedule, HeadsView
from mr2probe.optim import StackedAdamW


def make_method(name: str, x: torch.Tensor, y: torch.Tensor, k: int, probe: ProbeStack, cfg: ProbeConfig):
    def represent_train():
        with torch.no_grad():
            yield probe.represent(x), y

    ctx = FitContext(data=FitData(x=x, y=y, val_x=x[:8], val_y=y[:8], num_classes=k),
                     heads=HeadsView(config=cfg, rep_dim=probe.out_dim, represent_train=represent_train,
                                     predict=lambda v: probe(v)[1]),
                     schedule=FitSchedule(epochs=1, batch_size=len(y), seed=0))
    cls = METHODS.get(name)
    m = cls([{**cls.defaults, "lr": 1e-3, "weight_decay": 1e-4}], ctx)
    m.prepare()
    m.on_epoch_start(0)
    return m


def time_steps(name: str, x: torch.Tensor, y: torch.Tensor, k: int, steps: int) -> float:
    """Mean seconds per training step on the batch (x, y), on their device; statistics come from a training set
    with every class (4 samples each), as ``prepare`` would compute them."""
    dev = x.device
    cfg = ProbeConfig(head="linear", adapter="linear", width=x.shape[1])
    probe = ProbeStack(cfg, x.shape[1], k, [0]).to(dev)
    gen = torch.Generator().manual_seed(1)
    train_y = (torch.arange(4 * k) % k).to(dev)
    method = make_method(name, torch.randn(4 * k, x.shape[1], generator=gen).to(dev), train_y, k, probe, cfg)
    opt = StackedAdamW([(list(probe.parameters()), torch.tensor([1e-3], device=dev),
                         torch.tensor([1e-4], device=dev))], steps + 2)
    idx = torch.arange(len(y))

    def step() -> None:
        rep, logits = probe(x)
        loss = method.loss(Batch(logits, rep, y, idx)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(2):  # warm-up
        step()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - t0) / steps


def median_steps(x: torch.Tensor, y: torch.Tensor, k: int, steps: int, repeats: int) -> tuple[float, float]:
    """Median seconds per CE step and per MR2 step, the two timed alternately ``repeats`` times."""
    ce, mr2 = [], []
    for _ in range(repeats):
        ce.append(time_steps("ce", x, y, k, steps))
        mr2.append(time_steps("mr2", x, y, k, steps))
    return sorted(ce)[len(ce) // 2], sorted(mr2)[len(mr2) // 2]


def time_rep_layouts(z: torch.Tensor, y: torch.Tensor, steps: int) -> dict[str, float]:
    """Milliseconds per forward + backward of the representation term in each layout."""
    from mr2probe.methods.mr2 import rep_margin_loss

    zz = z[None].clone().requires_grad_(True)
    s_bar, tau = torch.tensor([float(z.shape[1])]), torch.tensor([10.0 * z.shape[1]])
    out = {}
    for layout in ("blocks", "pairs", "auto"):
        t0 = time.perf_counter()
        for _ in range(steps):
            rep_margin_loss(zz, y, s_bar, tau, layout=layout).sum().backward()
        out[layout] = (time.perf_counter() - t0) / steps * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="100,1000")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5, help="alternate CE/MR2 timings this many times; take medians")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, B={args.batch}, D={args.dim}")
    for k in (int(v) for v in args.ks.split(",")):
        x = torch.randn(args.batch, args.dim)
        y = torch.randint(0, k, (args.batch,))  # a random batch: at K=1000 few same-class pairs
        ce_t, mr2_t = median_steps(x, y, k, args.steps, args.repeats)
        print(f"K={k}: ce step {ce_t * 1e3:.2f} ms, mr2 step {mr2_t * 1e3:.2f} ms")
        print(f"K={k} mr2/ce={mr2_t / ce_t:.2f}")
        rep = time_rep_layouts(x, y, args.steps)
        print(f"K={k}: representation term fwd+bwd: " + ", ".join(f"{n} {t:.2f} ms" for n, t in rep.items()))


if __name__ == "__main__":
    main()
