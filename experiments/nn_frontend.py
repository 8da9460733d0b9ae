"""Models written with TVM's own model API, ``tvm.relax.frontend.nn``, handed to collage as their
users hold them: ``export_tvm``'s module (its one function named after the method,
``forward``) with the weights as ``params``.

    python -m experiments.nn_frontend [--model mlp decoder unet_block] [--threads 2] [--out J]
                                      [--without attention_as_matmuls]

The models are built from the modules TVM ships (Linear, Embedding, RMSNorm, GroupNorm,
Conv2D, its diffusers-style Attention) and its ops (``scaled_dot_product_attention`` writes
``relax.nn.attention``). Such a module has no file and no torch module beside it, so the peer
its users have without collage is TVM's default pipeline (``tvm.compile`` of the module with
its weights bound, untuned); each engine alone on the whole module is among collage's
finalists, and its time in the finalists' race is recorded with the choice. Collage and TVM
are timed against each other with the project's protocol (``experiments.bench.Settings``),
through the call a user makes, ``opt(x)``. ``--without STEP`` simplifies without one of
``collage.simplify``'s steps: how the models ran before it.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import numpy as np

from experiments.bench import Prepared, Settings, metadata, summarize, time_peers
from experiments.peers import Runner, pin_threads

MODELS = ("mlp", "decoder", "unet_block")
VOCAB = 4096  # the decoder's embedding rows, which its token ids index


def _modules():
    """The model classes, defined on first use: TVM is imported only after ``pin_threads``."""
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import op

    class MLP(nn.Module):
        def __init__(self):
            self.fc1, self.fc2 = nn.Linear(256, 1024), nn.Linear(1024, 256)

        def forward(self, x):
            return self.fc2(op.gelu(self.fc1(x)))

    class DecoderLayer(nn.Module):  # Llama's: RMSNorm, causal attention, SiLU-gated feed-forward
        def __init__(self, hidden=256, heads=4, ffn=688):
            self.heads, self.ffn = heads, ffn
            self.attention_norm, self.ffn_norm = nn.RMSNorm(hidden, -1, bias=False), nn.RMSNorm(hidden, -1, bias=False)
            self.qkv, self.o = nn.Linear(hidden, 3 * hidden, bias=False), nn.Linear(hidden, hidden, bias=False)
            self.gate_up, self.down = nn.Linear(hidden, 2 * ffn, bias=False), nn.Linear(ffn, hidden, bias=False)

        def forward(self, x):
            b, s, d = x.shape
            qkv = op.reshape(self.qkv(self.attention_norm(x)), (b, s, 3 * self.heads, d // self.heads))
            q, k, v = op.split(qkv, 3, axis=2)
            x = x + self.o(op.reshape(op.scaled_dot_product_attention(q, k, v, is_causal=True), (b, s, d)))
            gate, up = op.split(self.gate_up(self.ffn_norm(x)), 2, axis=-1)
            return x + self.down(op.silu(gate) * up)

    class Decoder(nn.Module):
        def __init__(self):
            self.embed = nn.Embedding(VOCAB, 256)
            self.layers = nn.ModuleList([DecoderLayer() for _ in range(2)])
            self.norm = nn.RMSNorm(256, -1, bias=False)

        def forward(self, ids):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            return self.norm(x)

    class UNetBlock(nn.Module):  # a diffusion U-Net's residual block and self-attention
        def __init__(self, channels=64):
            self.norm1, self.norm2 = nn.GroupNorm(8, channels), nn.GroupNorm(8, channels)
            self.conv1 = nn.Conv2D(channels, channels, 3, padding=1)
            self.conv2 = nn.Conv2D(channels, channels, 3, padding=1)
            self.attention = nn.modules.Attention(channels, heads=2, dim_head=32)

        def forward(self, x):
            x = x + self.conv2(op.silu(self.norm2(self.conv1(op.silu(self.norm1(x))))))
            b, c, h, w = x.shape
            tokens = op.permute_dims(op.reshape(x, (b, c, h * w)), [0, 2, 1])
            tokens = tokens + self.attention(tokens)
            return op.reshape(op.permute_dims(tokens, [0, 2, 1]), (b, c, h, w))

    return {
        "mlp": (MLP, {"x": nn.spec.Tensor((1, 256), "float32")}),
        "decoder": (Decoder, {"ids": nn.spec.Tensor((1, 64), "int32")}),
        "unet_block": (UNetBlock, {"x": nn.spec.Tensor((1, 64, 16, 16), "float32")}),
    }


def exported(name: str, seed: int = 0):
    """``name``'s module as ``export_tvm`` gives it, weights drawn for its parameters, and one input."""
    model, spec = _modules()[name]
    mod, parameters = model().export_tvm(spec={"forward": spec})
    rng = np.random.default_rng(seed)
    weights = {p: (rng.standard_normal([int(d) for d in t.shape]) * 0.05).astype(t.dtype) for p, t in parameters}
    (data,) = spec.values()
    shape = [int(d) for d in data.shape]
    x = rng.integers(0, VOCAB, shape) if "int" in data.dtype else rng.standard_normal(shape)
    return mod, weights, x.astype(data.dtype)


def measure(name: str, settings: Settings) -> dict:
    """``name``'s entry: collage and TVM's default pipeline timed against each other, the
    finalists collage raced (each engine alone among them) and what it kept."""
    import tvm
    from tvm import relax

    import collage

    mod, weights, x = exported(name)
    target = tvm.target.Target({"kind": "llvm", "num-cores": settings.threads})
    bound = relax.transform.BindParams("forward", {k: tvm.runtime.tensor(v) for k, v in weights.items()})(mod)
    forward, tensor = relax.VirtualMachine(tvm.compile(bound, target=target), tvm.cpu())["forward"], tvm.runtime.tensor(x)
    expected = forward(tensor).numpy()
    opt = collage.optimize(mod, params=weights, threads=settings.threads)
    print(opt.report(), flush=True)
    error = float(np.abs(opt(x) - expected).max() / np.abs(expected).max())
    peers = {"collage": Prepared(Runner(lambda: opt(x), None), opt.record.seconds.total, error),
             "tvm": Prepared(Runner(lambda: forward(tensor), None), 0.0, 0.0)}  # fmt: skip
    timed, _ = time_peers(peers, settings)
    timed = {peer: summarize(timed[peer]) for peer in peers}
    return {
        "meta": metadata(settings),
        "peers": timed,
        "max_rel_err": error,
        "optimize_s": round(opt.record.seconds.total, 1),
        "chosen": str(opt.record.chosen),
        "finalists_ms": {str(n): round(f.measured.median_ms, 4) for n, f in opt.record.finalists.items()},
        "simplified": {s.name: s.applied for s in opt.simplified.steps if s.applied} if opt.simplified else None,
        "speedup_over_tvm": round(timed["tvm"]["median_ms"] / timed["collage"]["median_ms"], 3),
    }


def _simplify_without(step: str) -> None:
    """``optimize`` simplifies without ``step`` from now on, in this process."""
    from collage import prepare
    from collage.model.simplify import DEFAULT_STEPS, simplify

    steps = tuple(s for s in DEFAULT_STEPS if s.name != step)
    if len(steps) == len(DEFAULT_STEPS):
        raise SystemExit(f"no simplify step is called {step!r}")
    prepare.simplify = functools.partial(simplify, steps=steps)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "nn_frontend.json")
    parser.add_argument("--without", metavar="STEP", help="simplify without this step of collage.simplify")
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    if args.without:
        _simplify_without(args.without)
    settings = Settings(threads=args.threads)
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    for name in args.model:
        results[name] = measure(name, settings)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        r = results[name]
        print(f"{name}: collage {r['peers']['collage']['median_ms']:.3f} ms, tvm {r['peers']['tvm']['median_ms']:.3f} ms "
              f"({r['speedup_over_tvm']}x), kept {r['chosen']}, finalists {r['finalists_ms']}", flush=True)


if __name__ == "__main__":
    main()
