#!/usr/bin/env python3
# KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
"""Tabulates KokkosMoE router benchmarks (Google Benchmark JSON) beside the PyTorch reference (router_reference.py).

Writes a markdown table (microseconds, GB/s, fraction of the copy baseline, speedup over torch eager and
torch.compile, the benchmark target checks on a GPU) and, when matplotlib is importable, a PNG plot.
Only the Python standard library is required.

  python3 tabulate.py --bench kokkosmoe.json [--bench more.json] [--torch torch.json] \\
      --out results.md [--plot results.png] [--title "H200"]

Benchmark names are router/<op>/<preset>/<dtype>/<impl>/<warm|cold>/T:<T>[/...]; the PyTorch records carry op,
preset, dtype, T and impl (eager | compile). Times are medians where Google Benchmark aggregates exist
(--benchmark_repetitions), else the single run. The fraction of copy bandwidth of every row, PyTorch's included, is
(bytes the operation must move / time) / the copy baseline of the C++ run (the PyTorch run's own copy baseline when
no C++ run is given).
"""

import argparse
import json
import math
import sys

TIME_SCALE = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
OP_ORDER = ["fwd_dense", "fwd_bitmap", "fwd_compact", "bwd_dense", "bwd_compact", "aux_scores_fwd", "aux_scores_bwd",
            "aux_loss_fwd", "aux_loss_bwd"]
PRESET_ORDER = ["deepseek-v3", "qwen3-moe", "mixtral", "large", "llama4-scout", "llama4-maverick"]


def order_key(seq, v):
    return (seq.index(v), v) if v in seq else (len(seq), v)


def parse_bench_name(name):
    """router/<op>/<preset>/<dtype>/<impl>/<variant>/T:<T>/... -> dict, or None for other benchmarks."""
    parts = name.split("/")
    if len(parts) < 7 or parts[0] != "router":
        return None
    rec = dict(op=parts[1], preset=parts[2], dtype=parts[3], impl=parts[4], variant=parts[5])
    for seg in parts[6:]:
        if seg.startswith("T:"):
            try:
                rec["T"] = int(seg[2:])
            except ValueError:
                return None
    return rec if "T" in rec else None


def load_bench(paths):
    """Returns (context, {key: row}, baselines) from Google Benchmark JSON files (later files win)."""
    context, rows, baselines = {}, {}, {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        context.update(data.get("context", {}))
        entries = data.get("benchmarks", [])
        has_median = {e.get("run_name") for e in entries
                      if e.get("run_type") == "aggregate" and e.get("aggregate_name") == "median"}
        for e in entries:
            run_name = e.get("run_name", e.get("name", ""))
            if e.get("run_type") == "aggregate":
                if e.get("aggregate_name") != "median":
                    continue
            elif run_name in has_median:
                continue  # repetitions: use the median aggregate instead
            if e.get("error_occurred"):
                print("warning: %s: %s" % (e.get("name"), e.get("error_message", "error")), file=sys.stderr)
                continue
            us = e.get("real_time", float("nan")) * TIME_SCALE.get(e.get("time_unit", "ns"), 1e-3)
            if run_name.startswith("BM_CopyBaseline"):
                baselines["copy"] = dict(us=us, GBps=e.get("GB/s"))
                continue
            if run_name.startswith("BM_EmptyKernel"):
                baselines["empty"] = dict(us=us)
                continue
            rec = parse_bench_name(run_name)
            if rec is None:
                continue
            rec.update(us=us, GBps=e.get("GB/s"), frac=e.get("frac_copy"), target_ratio=e.get("target_ratio"),
                       bytes_per_token=e.get("bytes_per_token"), label=e.get("label", ""))
            rows[(rec["op"], rec["preset"], rec["dtype"], rec["impl"], rec["variant"], rec["T"])] = rec
    return context, rows, baselines


def load_torch(path):
    """Returns (context, {(op, preset, dtype, impl, T): record}) from router_reference.py's JSON."""
    with open(path) as f:
        data = json.load(f)
    out = {}
    for r in data.get("results", []):
        if "median_us" not in r:
            continue
        out[(r["op"], r["preset"], r["dtype"], r["impl"], int(r["T"]))] = r
    return data.get("context", {}), out


def fnum(v, digits=1):
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return "-"
    if abs(v) >= 1e5:
        return "%.3g" % v
    return ("%%.%df" % digits) % v


def ffrac(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return "%.3f" % v if v >= 0.001 else "%.1e" % v


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", action="append", default=[], help="Google Benchmark JSON (repeatable)")
    ap.add_argument("--torch", default=None, help="router_reference.py JSON")
    ap.add_argument("--out", default=None, help="markdown output (default: stdout)")
    ap.add_argument("--plot", default=None, help="PNG plot (needs matplotlib; skipped with a note otherwise)")
    ap.add_argument("--title", default="KokkosMoE router benchmarks")
    ap.add_argument("--targets", choices=["auto", "on", "off"], default="auto",
                    help="issue-3 target checks: auto = only when the C++ run was on a GPU")
    args = ap.parse_args(argv)
    if not args.bench and not args.torch:
        ap.error("give --bench and/or --torch")

    ctx, rows, baselines = load_bench(args.bench) if args.bench else ({}, {}, {})
    tctx, trows = load_torch(args.torch) if args.torch else ({}, {})
    copy = None
    try:
        copy = float(ctx["copy_baseline_GBps"])
    except (KeyError, ValueError):
        copy = tctx.get("copy_GBps")
    t_floor = None
    try:
        t_floor = float(ctx["t_floor_us"])
    except (KeyError, ValueError):
        pass

    def torch_us(op, preset, dtype, impl, T):
        r = trows.get((op, preset, dtype, impl, T))
        return r["median_us"] if r else None

    def torch_frac(r):
        if r is None or not copy:
            return None
        return r["bytes_per_token"] * r["T"] / (r["median_us"] * 1e-6) / 1e9 / copy

    md = ["# %s\n" % args.title]
    # --- context ---
    keys = ["date", "host_name", "execution_space", "execution_space_concurrency", "gpu", "gpu_sm_count",
            "cuda_driver_version", "kokkos_version", "kokkosmoe_git", "kokkosmoe_build_type", "compiler",
            "router_specialization", "copy_baseline_GBps", "t_floor_us", "load_avg", "num_cpus", "mhz_per_cpu"]
    crow = [(k, ctx[k]) for k in keys if k in ctx]
    if tctx:
        crow += [("torch." + k, tctx[k]) for k in ("torch", "gpu", "cuda", "copy_GBps", "iters", "compile_dynamic_T",
                                                  "compile_mode", "date") if k in tctx]
    if crow:
        md.append(md_table(["context", "value"], [(k, fnum(v, 2) if isinstance(v, float) else v) for k, v in crow]))
    if baselines:
        b = []
        if "copy" in baselines:
            b.append("BM_CopyBaseline %s GB/s (read+write)" % fnum(baselines["copy"].get("GBps"), 1))
        if "empty" in baselines:
            b.append("BM_EmptyKernel %s us" % fnum(baselines["empty"]["us"], 2))
        md.append("Baselines in this run: " + "; ".join(b) + ".\n")

    presets = sorted({r["preset"] for r in rows.values()} | {k[1] for k in trows}, key=lambda v: order_key(PRESET_ORDER, v))
    dtypes = sorted({r["dtype"] for r in rows.values()} | {k[2] for k in trows})
    Ts = sorted({r["T"] for r in rows.values()} | {k[4] for k in trows})
    impls = sorted({r["impl"] for r in rows.values()})

    # --- summary: fraction of copy bandwidth ---
    if rows:
        md.append("## Fraction of copy bandwidth (bytes the operation must move / time / copy GB/s)\n")
        for impl in impls:
            for dt in dtypes:
                table = []
                for pr in presets:
                    for op in sorted({r["op"] for r in rows.values()}, key=lambda v: order_key(OP_ORDER, v)):
                        cells = [ffrac(rows[k]["frac"]) if k in rows else "-"
                                 for k in ((op, pr, dt, impl, "warm", T) for T in Ts)]
                        if any(c != "-" for c in cells):
                            table.append([pr, op] + cells)
                if table:
                    md.append("### %s, %s, warm\n" % (impl, dt))
                    md.append(md_table(["preset", "op"] + ["T=%d" % T for T in Ts], table))

    # --- details ---
    md.append("## Details\n")
    md.append("µs: median time per call (fenced). ×eager / ×compile: PyTorch time / KokkosMoE time (> 1: faster "
              "than PyTorch). target: time / (t_floor + bytes / (0.85 · copy GB/s)), ≤ 1 meets docs/router.md §17.\n")
    for pr in presets:
        table = []
        ops = sorted({r["op"] for r in rows.values() if r["preset"] == pr} | {k[0] for k in trows if k[1] == pr},
                     key=lambda v: order_key(OP_ORDER, v))
        for op in ops:
            for dt in dtypes:
                for T in Ts:
                    te, tc = torch_us(op, pr, dt, "eager", T), torch_us(op, pr, dt, "compile", T)
                    mine = [r for r in rows.values() if (r["op"], r["preset"], r["dtype"], r["T"]) == (op, pr, dt, T)]
                    mine.sort(key=lambda r: (r["impl"] != "auto", r["variant"] != "warm"))
                    for r in mine:
                        table.append([op, dt, T, "%s/%s" % (r["impl"], r["variant"]), fnum(r["us"], 1),
                                      fnum(r["GBps"], 1), ffrac(r["frac"]), fnum(r["target_ratio"], 2), fnum(te, 1),
                                      fnum(tc, 1), fnum(te / r["us"], 2) if te else "-",
                                      fnum(tc / r["us"], 2) if tc else "-"])
                    if not mine and (te or tc):
                        tr = trows.get((op, pr, dt, "eager", T)) or trows.get((op, pr, dt, "compile", T))
                        table.append([op, dt, T, "torch only", "-", "-", ffrac(torch_frac(tr)), "-", fnum(te, 1),
                                      fnum(tc, 1), "-", "-"])
        if table:
            md.append("### %s\n" % pr)
            md.append(md_table(["op", "dtype", "T", "impl/cache", "µs", "GB/s", "frac copy", "target", "torch eager µs",
                                "torch compile µs", "×eager", "×compile"], table))

    # --- portable vs auto ---
    pairs = [(k, rows[k], rows.get((k[0], k[1], k[2], "portable", k[4], k[5]))) for k in rows if k[3] == "auto"]
    pairs = [(k, a, p) for k, a, p in pairs if p is not None]
    if pairs:
        md.append("## Generic Kokkos path vs specialization (time portable / time auto)\n")
        table = [[k[1], k[0], k[2], k[5], fnum(a["us"], 1), fnum(p["us"], 1), fnum(p["us"] / a["us"], 2)]
                 for k, a, p in sorted(pairs, key=lambda x: (order_key(PRESET_ORDER, x[0][1]),
                                                             order_key(OP_ORDER, x[0][0]), x[0][2], x[0][5]))]
        md.append(md_table(["preset", "op", "dtype", "T", "auto µs", "portable µs", "ratio"], table))

    # --- cold vs warm ---
    cold = [(k, rows[k], rows.get(k[:4] + ("warm", k[5]))) for k in rows if k[4] == "cold"]
    if cold:
        md.append("## Cold (buffers rotated over > 4× L2) vs warm\n")
        table = [[k[1], k[0], k[2], k[3], k[5], fnum(w["us"], 1) if w else "-", fnum(c["us"], 1),
                  ffrac(w["frac"]) if w else "-", ffrac(c["frac"])] for k, c, w in sorted(cold, key=lambda x: x[0])]
        md.append(md_table(["preset", "op", "dtype", "impl", "T", "warm µs", "cold µs", "warm frac", "cold frac"],
                           table))

    # --- benchmark targets ---
    on_gpu = ctx.get("gpu", "none") not in ("none", "")
    if rows and (args.targets == "on" or (args.targets == "auto" and on_gpu)):
        md.append(targets_section(rows, trows, t_floor, copy))

    text = "\n".join(md)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print("wrote %s" % args.out)
    else:
        print(text)
    if args.plot:
        plot(args.plot, args.title, rows, trows, presets, copy)
    return 0


def targets_section(rows, trows, t_floor, copy):
    """The benchmark targets, each with its measured value and met / missed."""
    lines, checks = ["## Targets\n"], []

    def get(op, pr, dt, T, impl="auto"):
        return rows.get((op, pr, dt, impl, "warm", T))

    def add(what, value, ok):
        checks.append([what, value, "met" if ok else "**missed**"])

    Ts = sorted({k[5] for k in rows})
    for T in [t for t in Ts if t >= 65536]:
        for op, need in (("fwd_dense", 0.85), ("bwd_dense", 0.85), ("fwd_compact", 0.80), ("bwd_compact", 0.80)):
            r = get(op, "deepseek-v3", "bf16", T)
            if r and r["frac"] is not None:
                add("deepseek-v3 bf16 %s T=%d: frac copy >= %.2f" % (op, T, need), ffrac(r["frac"]), r["frac"] >= need)
    ordered = sorted(rows.items(), key=lambda kv: (order_key(PRESET_ORDER, kv[0][1]), order_key(OP_ORDER, kv[0][0]),
                                                   kv[0][2], kv[0][5]))
    for (op, pr, dt, impl, var, T), r in ordered:
        if impl != "auto" or var != "warm" or T < 16384:
            continue
        if op.startswith("fwd_") and op != "fwd_bitmap":
            te = trows.get((op, pr, dt, "eager", T))
            tc = trows.get((op, pr, dt, "compile", T))
            if te:
                add("%s %s %s T=%d: >= 10x torch eager" % (pr, dt, op, T), fnum(te["median_us"] / r["us"], 1) + "x",
                    te["median_us"] / r["us"] >= 10)
            if tc:
                add("%s %s %s T=%d: >= 2x torch.compile" % (pr, dt, op, T), fnum(tc["median_us"] / r["us"], 1) + "x",
                    tc["median_us"] / r["us"] >= 2)
    # backward: the better of the dense and compact backward against the better torch.compile backward
    for pr in sorted({k[1] for k in rows}, key=lambda v: order_key(PRESET_ORDER, v)):
        for dt in sorted({k[2] for k in rows}):
            for T in [t for t in Ts if t >= 16384]:
                ours = [get(op, pr, dt, T) for op in ("bwd_dense", "bwd_compact")]
                ours = [r for r in ours if r]
                theirs = [trows.get((op, pr, dt, "compile", T)) for op in ("bwd_dense", "bwd_compact")]
                theirs = [r for r in theirs if r]
                if ours and theirs:
                    best = min(r["us"] for r in ours)
                    ref = min(r["median_us"] for r in theirs)
                    add("%s %s backward T=%d: >= 1.5x torch.compile (best of dense/compact)" % (pr, dt, T),
                        fnum(ref / best, 2) + "x", ref / best >= 1.5)
    for (op, pr, dt, impl, var, T), r in ordered:
        if T == 4096 and impl == "auto" and var == "warm" and r["target_ratio"] is not None:
            add("%s %s %s T=4096: t <= t_floor + bytes/(0.85 B_copy)" % (pr, dt, op), fnum(r["target_ratio"], 2),
                r["target_ratio"] <= 1.0)
    ratios = [rows[k]["us"] / r["us"] for k, r in rows.items() if k[3] == "auto" and k[4] == "warm"
              for k in [k[:3] + ("portable",) + k[4:]] if k in rows]
    if ratios:
        worst = max(ratios)
        add("generic Kokkos path within 2x of the specialization (worst case)", fnum(worst, 2) + "x", worst <= 2.0)
    if not checks:
        return "## Targets\n\nNo case of the target sets in these results.\n"
    met = sum(1 for c in checks if c[2] == "met")
    lines.append("%d of %d checks met (t_floor %s µs, copy %s GB/s).\n" % (met, len(checks), fnum(t_floor, 2),
                                                                          fnum(copy, 1)))
    lines.append(md_table(["target", "measured", ""], checks))
    return "\n".join(lines)


PLOT_OPS = ["fwd_dense", "fwd_compact", "bwd_dense", "bwd_compact", "aux_scores_fwd", "aux_loss_fwd"]


def plot(path, title, rows, trows, presets, copy):
    """One panel per preset: fraction of copy bandwidth against T for the main operations (Implementation::Auto,
    warm; bf16 when present): KokkosMoE solid, torch eager dotted, torch.compile dashed, one colour per operation."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not available; no plot written", file=sys.stderr)
        return
    have_bf16 = any(r["dtype"] == "bf16" for r in rows.values()) or any(k[2] == "bf16" for k in trows)
    dtype = "bf16" if have_bf16 else "float"
    n = max(1, len(presets))
    cols = min(2, n)
    nrows = (n + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 4.2 * nrows + 1.2), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    handles = {}
    for i, pr in enumerate(presets):
        ax = axes[i // cols][i % cols]
        for j, op in enumerate(PLOT_OPS):
            c = colours[j % len(colours)]
            pts = sorted((r["T"], r["frac"]) for r in rows.values()
                         if (r["preset"], r["op"], r["dtype"], r["impl"], r["variant"]) == (pr, op, dtype, "auto", "warm")
                         and r["frac"] is not None)
            if pts:
                (h,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], color=c, marker="o", label="KokkosMoE " + op)
                handles.setdefault("KokkosMoE " + op, h)
            for mode, style in (("eager", ":"), ("compile", "--")):
                pts = sorted((T, r["bytes_per_token"] * T / (r["median_us"] * 1e-6) / 1e9 / copy)
                             for (o, p, d, m, T), r in trows.items() if (o, p, d, m) == (op, pr, dtype, mode) and copy)
                if pts:
                    (h,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], color=c, linestyle=style, marker="x",
                                   linewidth=1, label="torch %s %s" % (mode, op))
                    handles.setdefault("torch %s %s" % (mode, op), h)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_title("%s (%s)" % (pr, dtype))
        ax.set_xlabel("tokens T")
        ax.set_ylabel("fraction of copy bandwidth")
        ax.grid(True, which="both", alpha=0.3)
    for j in range(len(presets), nrows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle(title + " (solid: KokkosMoE, dotted: torch eager, dashed: torch.compile)")
    fig.legend(list(handles.values()), list(handles.keys()), loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.12 if handles else 0, 1, 1))
    fig.savefig(path, dpi=120)
    print("wrote %s" % path)


if __name__ == "__main__":
    sys.exit(main())
