#!/usr/bin/env python3
# KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
"""PyTorch reference of the KokkosMoE router math, timed with CUDA events, for comparison with the C++ benchmarks.

Same math as docs/router.md (the framework-reference style of TransformerEngine's tests):
  * Sigmoid (DeepSeek-V3: grouped top-k, FP32 expert bias shifting the selection only, normalization, scale),
  * Softmax post-top-k (softmax over the k selected logits = renormalized top-k; Qwen3-MoE, Mixtral, "large")
    and pre-top-k (softmax over all experts, not renormalized),
  * backward through autograd,
  * the aux-loss score helper and the aux loss (docs/router.md §10-§11),
each in eager mode and under torch.compile. Cases and names match perf_test/core/KokkosMoE_RouterBenchmarks.cpp:
op in {fwd_dense, fwd_bitmap, fwd_compact, bwd_dense, bwd_compact, aux_scores_fwd, aux_scores_bwd, aux_loss_fwd,
aux_loss_bwd}, preset in {deepseek-v3, qwen3-moe, mixtral, large}, dtype in {float, bf16}, T in
{4096, 16384, 65536, 262144}; result names are torch/<op>/<preset>/<dtype>/<eager|compile>/T:<T>.

Timing (like the C++ benchmarks, which fence before and after every call): every repetition starts from a
synchronized device, records a CUDA event, runs the operation, records a second event and synchronizes; the median
over the repetitions is reported. For backward cases the forward runs first, untimed, and the events bracket only
the backward. Inputs: seeded ~N(0, 1) logits, a uniform [-0.02, 0.02) FP32 bias for DeepSeek-V3, uniform upstream
gradients. torch.compile marks the token dimension dynamic by default (one compilation per preset, dtype and op;
--static compiles every T separately). Nothing is downloaded: only torch is needed.

Examples:
  python3 router_reference.py --out torch_h200.json                  # the full set (GPU)
  python3 router_reference.py --presets deepseek-v3 --tokens 4096 --modes eager --iters 5
  python3 router_reference.py --dry-run                              # list the cases; no torch needed
  python3 router_reference.py --dry-run --run-cpu --tokens 64        # tiny CPU run when torch (CPU) is present
  /usr/bin/python3 router_reference.py --device cpu --threads 2 --tokens 16384 --modes eager \
      --ops fwd_dense,bwd_dense --out torch_cpu.json                  # the host reference (Debian's python3-torch)
"""

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time

PRESETS = {
    # name: E, k, score function, pre-softmax, bias, groups, group_topk, scale  (docs/router.md §15)
    "deepseek-v3": dict(E=256, k=8, func="sigmoid", pre=False, bias=True, G=8, gk=4, scale=2.5),
    "qwen3-moe": dict(E=128, k=8, func="softmax", pre=False, bias=False, G=0, gk=0, scale=1.0),
    "mixtral": dict(E=8, k=2, func="softmax", pre=False, bias=False, G=0, gk=0, scale=1.0),
    "llama4-scout": dict(E=16, k=1, func="sigmoid", pre=False, bias=False, G=0, gk=0, scale=1.0),
    "llama4-maverick": dict(E=128, k=1, func="sigmoid", pre=False, bias=False, G=0, gk=0, scale=1.0),
    "large": dict(E=1024, k=32, func="softmax", pre=False, bias=False, G=0, gk=0, scale=1.0),
}
DEFAULT_PRESETS = ["deepseek-v3", "qwen3-moe", "mixtral", "large"]
OPS = ["fwd_dense", "fwd_bitmap", "fwd_compact", "bwd_dense", "bwd_compact", "aux_scores_fwd", "aux_scores_bwd",
       "aux_loss_fwd", "aux_loss_bwd"]
DTYPE_SIZE = {"float": 4, "bf16": 2}
EPS = 1e-20
AUX_COEFF = 1e-2


def bytes_per_token(op, p, s):
    """The bytes each operation must move per token: the formulas of KokkosMoE_RouterBenchmarks.cpp."""
    E, k = p["E"], p["k"]
    pre = p["func"] == "softmax" and p["pre"]
    return {
        "fwd_dense": E * (2 * s + 4) + E,
        "fwd_bitmap": E * (2 * s + 4) + math.ceil(E / 8),
        "fwd_compact": s * E + 8 * k,
        "bwd_dense": E * (2 * s + 4) + E,
        "bwd_compact": (s * E if pre else s * k) + 8 * k + s * E,
        "aux_scores_fwd": s * E + 8 * E + E,
        "aux_scores_bwd": 8 * E + s * E,
        "aux_loss_fwd": s * E,
        "aux_loss_bwd": s * E,
    }[op]


def aux_loss_const(p, total_tokens):
    """Const of docs/router.md §11 in the same order of operations (in double here; FP32 on the device)."""
    return ((p["E"] * AUX_COEFF) / p["k"]) / total_tokens / total_tokens


# --------------------------------------------------------------------------------------------------------------------
# The math (torch is imported lazily so that --dry-run works without it)
# --------------------------------------------------------------------------------------------------------------------

def make_math(torch):
    F = torch.nn.functional

    def activation(x, p):
        if p["func"] == "sigmoid":
            return torch.sigmoid(x)
        if p["func"] == "sqrtsoftplus":
            return torch.sqrt(F.softplus(x))
        return torch.softmax(x, dim=-1) if p["pre"] else x  # softmax post: raw logits until after the top-k

    def select(x, bias, p):
        """Returns (top-k indices [T, k] in selection order, unbiased values v [T, k] before normalization)."""
        T, E = x.shape
        k = p["k"]
        y = activation(x, p)
        s = y + bias if bias is not None else y
        if p["gk"] > 0:  # group-limited routing (docs/router.md §5.3)
            G, gk = p["G"], p["gk"]
            group_scores = s.view(T, G, E // G).topk(k // gk, dim=-1).values.sum(dim=-1)
            group_idx = group_scores.topk(gk, dim=-1).indices
            group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
            expert_mask = group_mask.unsqueeze(-1).expand(T, G, E // G).reshape(T, E)
            s = s.masked_fill(expert_mask == 0, float("-inf"))
        idx = s.topk(k, dim=-1).indices
        return idx, y.gather(1, idx)

    def weights_of(v, p):
        if p["func"] == "softmax" and not p["pre"]:
            v = torch.softmax(v, dim=-1)  # = softmax over all experts, renormalized over the top-k
        elif p["func"] != "softmax" and p["k"] > 1:
            v = v / (v.sum(dim=-1, keepdim=True) + EPS)
        return v * p["scale"]

    def router_dense(logits, bias, p):
        """TE-compatible forward: probs [T, E] (logits' dtype) and a bool routing map [T, E]."""
        x = logits.float()
        idx, v = select(x, bias, p)
        w = weights_of(v, p)
        probs = torch.zeros_like(x).scatter(1, idx, w).to(logits.dtype)
        routing_map = torch.zeros(x.shape, dtype=torch.bool, device=x.device).scatter_(1, idx, True)
        return probs, routing_map

    def router_bitmap(logits, bias, p):
        """As router_dense, with the map packed LSB-first into ceil(E/8) bytes per token (BitmapU8)."""
        probs, routing_map = router_dense(logits, bias, p)
        T, E = routing_map.shape
        nb = (E + 7) // 8
        m = routing_map.to(torch.uint8)
        if nb * 8 != E:
            m = F.pad(m, (0, nb * 8 - E))
        weights = (2 ** torch.arange(8, device=m.device, dtype=torch.int32))
        packed = (m.view(T, nb, 8).to(torch.int32) * weights).sum(dim=-1).to(torch.uint8)
        return probs, packed

    def router_compact(logits, bias, p):
        """Compact forward (docs/router.md §5.5): int32 ids [T, k] and FP32 weights [T, k]."""
        idx, v = select(logits.float(), bias, p)
        return idx.to(torch.int32), weights_of(v, p)

    def aux_scores(logits, p):
        """Aux-loss score helper (docs/router.md §10): FP32 scores over all E and a routing map of their top-k."""
        x = logits.float()
        if p["func"] == "softmax":
            s = torch.softmax(x, dim=-1)
        else:
            y = torch.sigmoid(x) if p["func"] == "sigmoid" else torch.sqrt(F.softplus(x))
            s = y / (y.sum(dim=-1, keepdim=True) + EPS)
        idx = s.topk(p["k"], dim=-1).indices
        routing_map = torch.zeros(x.shape, dtype=torch.bool, device=x.device).scatter_(1, idx, True)
        return s, routing_map

    def aux_loss(probs, tokens_per_expert, const, p):
        """Aux loss (docs/router.md §11) with C = E: Const * sum_c (sum_r probs[r, c]) * tpe[c]. Const is a 0-d FP32
        tensor, ((E * coeff) / topk) / T_total / T_total computed by aux_loss_const (a tensor, so that a dynamic T
        is not specialized by torch.compile)."""
        return const * (probs.float().sum(dim=0) * tokens_per_expert.float()).sum()

    return dict(router_dense=router_dense, router_bitmap=router_bitmap, router_compact=router_compact,
                aux_scores=aux_scores, aux_loss=aux_loss)


# --------------------------------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------------------------------

class Case:
    """One (op, preset, dtype, T): inputs, the function to time and, for backward ops, the untimed forward."""

    def __init__(self, torch, math_fns, op, preset, dtype, T, device, seed, compiled, dynamic_T=False):
        self.torch, self.op, self.preset, self.dtype, self.T = torch, op, preset, dtype, T

        def arg(t):  # a tensor handed to a (compiled) function: its token dimension is marked dynamic
            if dynamic_T:
                torch._dynamo.mark_dynamic(t, 0)
            return t

        p = self.p = PRESETS[preset]
        tdtype = torch.float32 if dtype == "float" else torch.bfloat16
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        E, k = p["E"], p["k"]
        self.logits = (torch.randn(T, E, generator=g, device=device, dtype=torch.float32)).to(tdtype)
        self.bias = None
        if p["bias"]:
            self.bias = torch.rand(E, generator=g, device=device, dtype=torch.float32) * 0.04 - 0.02
        uniform = lambda *shape, dt=torch.float32: (torch.rand(*shape, generator=g, device=device) * 2 - 1).to(dt)
        fn = compiled if compiled is not None else math_fns
        self.check = None
        bias = self.bias
        if op in ("fwd_dense", "fwd_bitmap", "fwd_compact"):
            f = fn[{"fwd_dense": "router_dense", "fwd_bitmap": "router_bitmap", "fwd_compact": "router_compact"}[op]]
            logits = arg(self.logits)
            # Training-style forwards run with autograd recording (the saved state is part of the cost);
            # the compact forward is the inference form.
            if op != "fwd_compact":
                logits = arg(logits.detach().requires_grad_(True))
                self.pre, self.timed = None, (lambda _: f(logits, bias, p))
            else:
                self.pre = None
                self.timed = lambda _: _no_grad(torch, f, logits, bias, p)
            self.check = lambda: f(logits, bias, p)
        elif op in ("bwd_dense", "bwd_compact"):
            f = fn["router_dense"] if op == "bwd_dense" else fn["router_compact"]
            grad = uniform(T, E, dt=tdtype) if op == "bwd_dense" else uniform(T, k)
            logits = arg(self.logits.detach().requires_grad_(True))

            def pre(_):
                out = f(logits, bias, p)[0 if op == "bwd_dense" else 1]
                return out

            self.pre = pre
            self.timed = lambda out: torch.autograd.grad(out, logits, grad)
        elif op in ("aux_scores_fwd", "aux_scores_bwd"):
            f = fn["aux_scores"]
            logits = arg(self.logits.detach().requires_grad_(True))
            if op == "aux_scores_fwd":
                self.pre, self.timed = None, (lambda _: f(logits, p))
                self.check = lambda: f(logits, p)
            else:
                grad = uniform(T, E)
                self.pre = lambda _: f(logits, p)[0]
                self.timed = lambda out: torch.autograd.grad(out, logits, grad)
        else:  # aux loss
            f = fn["aux_loss"]
            probs = arg((torch.rand(T, E, generator=g, device=device) * (2.0 / E)).to(tdtype).requires_grad_(True))
            tpe = torch.randint(1, 1000, (E,), generator=g, device=device, dtype=torch.int32)
            const = torch.tensor(aux_loss_const(p, T), dtype=torch.float32, device=device)
            if op == "aux_loss_fwd":
                self.pre, self.timed = None, (lambda _: f(probs, tpe, const, p))
            else:
                self.pre = lambda _: f(probs, tpe, const, p)
                self.timed = lambda out: torch.autograd.grad(out, probs)


def _no_grad(torch, f, *args):
    with torch.no_grad():
        return f(*args)


def median_and_min(xs):
    return statistics.median(xs), min(xs)


def time_case(torch, case, iters, warmup, use_cuda):
    """Median and minimum time in microseconds; every repetition starts from a synchronized device."""
    times = []
    for i in range(warmup + iters):
        if use_cuda:
            torch.cuda.synchronize()
            state = case.pre(None) if case.pre else None
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            case.timed(state)
            end.record()
            torch.cuda.synchronize()
            if i >= warmup:
                times.append(start.elapsed_time(end) * 1e3)
        else:
            state = case.pre(None) if case.pre else None
            t0 = time.perf_counter()
            case.timed(state)
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1e6)
    return median_and_min(times)


def copy_baseline_GBps(torch, use_cuda, device):
    """Device-to-device copy of 1 GiB (host: 256 MiB), read + write bytes counted, median of 20 (host: 5)."""
    n = (1 << 30 if use_cuda else 1 << 28) // 4
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ts = []
    for i in range(25 if use_cuda else 7):
        if use_cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            torch.cuda.synchronize()
            t = a.elapsed_time(b) * 1e-3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            t = time.perf_counter() - t0
        if i >= (5 if use_cuda else 2):
            ts.append(t)
    return 2.0 * n * 4 / statistics.median(ts) / 1e9


def configure_dynamo(torch, static):
    # Every preset and dtype is a recompilation of the same Python functions: raise the per-function cache limits so
    # that torch.compile never silently falls back to eager (the limit was renamed across releases).
    cfg = torch._dynamo.config
    if not static and hasattr(cfg, "automatic_dynamic_shapes"):
        # Only the token dimension (mark_dynamic) is symbolic; E and k stay compile-time constants per preset, as
        # they would in a model, instead of becoming dynamic after the second preset.
        cfg.automatic_dynamic_shapes = False
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, 1024)
    for name in ("accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, 4096)


def compare_outputs(torch, a, b):
    """Eager vs compiled forward outputs: fraction of tokens with identical selections, max abs diff of floats."""
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    same_rows, max_diff = 1.0, 0.0
    for x, y in zip(a, b):
        if x.dtype in (torch.bool, torch.uint8, torch.int32, torch.int64):
            eq = (x == y).reshape(x.shape[0], -1).all(dim=1)
            same_rows = min(same_rows, eq.float().mean().item())
        else:
            max_diff = max(max_diff, (x.float() - y.float()).abs().max().item())
    return dict(same_rows=same_rows, max_abs_diff=max_diff)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default=",".join(DEFAULT_PRESETS), help="comma-separated presets")
    ap.add_argument("--tokens", default="4096,16384,65536,262144", help="comma-separated token counts T")
    ap.add_argument("--dtypes", default="float,bf16", help="float and/or bf16")
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated ops")
    ap.add_argument("--modes", default="eager,compile", help="eager and/or compile")
    ap.add_argument("--iters", type=int, default=20, help="timed repetitions per case (median reported)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed repetitions per case (compile: first call)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--static", action="store_true", help="torch.compile each T separately (default: T dynamic)")
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode, e.g. max-autotune-no-cudagraphs")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--dry-run", action="store_true", help="list the cases (and write them) without running")
    ap.add_argument("--run-cpu", action="store_true", help="with --dry-run: run the cases on the CPU (no CUDA)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                    help="where to run: cuda, cpu (the host reference, timed with perf_counter), auto (cuda if any)")
    ap.add_argument("--threads", type=int, default=0, help="CPU runs: torch.set_num_threads (0: torch's default)")
    args = ap.parse_args(argv)

    presets = [s for s in args.presets.split(",") if s]
    dtypes = [s for s in args.dtypes.split(",") if s]
    ops = [s for s in args.ops.split(",") if s]
    modes = [s for s in args.modes.split(",") if s]
    try:
        tokens = [int(s) for s in args.tokens.split(",") if s]
    except ValueError:
        ap.error("--tokens expects comma-separated integers")
    for name, vals, known in (("preset", presets, PRESETS), ("dtype", dtypes, DTYPE_SIZE), ("op", ops, OPS),
                              ("mode", modes, ("eager", "compile"))):
        bad = [v for v in vals if v not in known]
        if bad:
            ap.error("unknown %s %s (known: %s)" % (name, ", ".join(bad), ", ".join(known)))
    if any(t < 1 for t in tokens) or args.iters < 1 or args.warmup < 0:
        ap.error("token counts and --iters must be >= 1, --warmup >= 0")

    cases = [(op, pr, dt, T) for pr in presets for op in ops for dt in dtypes for T in tokens]
    context = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "python": platform.python_version(), "iters": args.iters,
        "warmup": args.warmup, "seed": args.seed, "compile_dynamic_T": not args.static,
        "compile_mode": args.compile_mode or "default",
        "timing": "CUDA events around each call from a synchronized device; median over iters",
    }
    results = []
    if args.dry_run and not args.run_cpu:
        for op, pr, dt, T in cases:
            for mode in modes:
                results.append(dict(name="torch/%s/%s/%s/%s/T:%d" % (op, pr, dt, mode, T), op=op, preset=pr, dtype=dt,
                                    impl=mode, T=T, bytes_per_token=bytes_per_token(op, PRESETS[pr], DTYPE_SIZE[dt]),
                                    planned=True))
        print("dry run: %d cases x %d modes = %d measurements" % (len(cases), len(modes), len(results)))
        for r in results[:: max(1, len(results) // 12)]:
            print("  " + r["name"])
        _write(args.out, context, results)
        return 0

    import torch  # noqa: E402  (lazy: --dry-run works without torch)
    import warnings

    warnings.filterwarnings("ignore", message=r"(?is)\s*online softmax")  # an Inductor note, printed per compile

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA device", file=sys.stderr)
        return 2
    use_cuda = torch.cuda.is_available() and not args.run_cpu and args.device != "cpu"
    if not use_cuda and not args.dry_run and args.device == "auto":
        print("error: no CUDA device; use --device cpu for a CPU run", file=sys.stderr)
        return 2
    device = "cuda" if use_cuda else "cpu"
    if not use_cuda:
        if args.threads > 0:
            torch.set_num_threads(args.threads)
        context["threads"] = torch.get_num_threads()
        context["timing"] = "time.perf_counter around each call; median over iters"
    context.update(torch=torch.__version__, device=device,
                   gpu=torch.cuda.get_device_name() if use_cuda else "none",
                   cuda=getattr(torch.version, "cuda", None) or "none")
    context["copy_GBps"] = copy_baseline_GBps(torch, use_cuda, device)
    print("torch %s on %s (%s); copy baseline %.1f GB/s (read+write)" % (
        torch.__version__, device, context["gpu"], context["copy_GBps"]), flush=True)

    math_fns = make_math(torch)
    compiled = {}
    if "compile" in modes:
        configure_dynamo(torch, args.static)

    def compiled_fns():
        # One torch.compile wrapper per function; presets, dtypes and (with --static) token counts are guarded
        # recompilations of it (the cache limits are raised in configure_dynamo).
        if not compiled:
            kw = dict(fullgraph=True, dynamic=False if args.static else None)
            if args.compile_mode:
                kw["mode"] = args.compile_mode
            compiled.update({n: torch.compile(f, **kw) for n, f in math_fns.items()})
        return compiled

    for op, pr, dt, T in cases:
        for mode in modes:
            name = "torch/%s/%s/%s/%s/T:%d" % (op, pr, dt, mode, T)
            rec = dict(name=name, op=op, preset=pr, dtype=dt, impl=mode, T=T,
                       bytes_per_token=bytes_per_token(op, PRESETS[pr], DTYPE_SIZE[dt]))
            try:
                fns = compiled_fns() if mode == "compile" else None
                case = Case(torch, math_fns, op, pr, dt, T, device, args.seed, fns,
                            dynamic_T=mode == "compile" and not args.static)
                t_compile = time.perf_counter()
                med, mn = time_case(torch, case, args.iters, args.warmup, use_cuda)
                rec.update(median_us=med, min_us=mn, iters=args.iters,
                           GBps=rec["bytes_per_token"] * T / (med * 1e-6) / 1e9,
                           wall_s=time.perf_counter() - t_compile)
                rec["frac_copy"] = rec["GBps"] / context["copy_GBps"]
                if mode == "compile" and case.check is not None:
                    ref = Case(torch, math_fns, op, pr, dt, T, device, args.seed, None)
                    rec["vs_eager"] = compare_outputs(torch, ref.check(), case.check())
                    if rec["vs_eager"]["same_rows"] < 0.999:
                        print("warning: %s: compiled selection differs from eager on %.3f%% of tokens" % (
                            name, 100 * (1 - rec["vs_eager"]["same_rows"])), file=sys.stderr)
                del case
            except Exception as e:  # report and go on: one failing case must not lose the others
                rec["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                print("error: %s: %s" % (name, rec["error"]), file=sys.stderr, flush=True)
            results.append(rec)
            if "median_us" in rec:
                print("%-58s %11.1f us %9.1f GB/s  frac %.3f" % (name, rec["median_us"], rec["GBps"],
                                                                  rec["frac_copy"]), flush=True)
            _write(args.out, context, results)  # after every case: a killed run keeps what it measured
        if use_cuda:
            torch.cuda.empty_cache()
    return 1 if any("error" in r for r in results) else 0


def _write(path, context, results):
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(dict(context=context, results=results), f, indent=1)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
