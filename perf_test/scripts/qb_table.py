#!/usr/bin/env python3
# KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
"""The Quantile Balancing table of perf_test/results/<machine>/README.md from one device run.

  qb_table.py --bench kmoe_qb.json [--te te_qb.json]

--bench: KokkosMoE_RouterBenchmarks --benchmark_filter='^BM_Copy|router_qb/' (JSON out);
--te: TransformerEngine's QB kernels timed by the harness of perf_test/README.md in the same device call.
Prints one row per shape: the plain forward, both QB modes, the ratios to the plain forward, TE's times and the
speedups over TE (TE time / KokkosMoE time), then the target checks (fused <= 1.3x plain; >= 1.5x TE at T >= 16384).
Standard library only.
"""
import argparse
import json
import re
import sys

NAME = re.compile(r"(?:router_qb|te)/(plain|fused|two_pass|histogram)/E:(\d+)/k:(\d+)/(float|bf16)/(bytemap|idx32)/T:(\d+)")


def load(path):
    with open(path) as f:
        doc = json.load(f)
    times, copy = {}, None
    for b in doc.get("benchmarks", []):
        if b["name"].startswith("BM_CopyBaseline"):
            copy = b.get("GB/s")
            continue
        m = NAME.match(b["name"])
        if m and "device_us" in b:
            op, E, k, dt, out, T = m.groups()
            times[(int(E), int(k), dt, out, int(T), op)] = float(b["device_us"])
    return times, copy, doc.get("context", {})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--te")
    args = ap.parse_args()
    km, copy, ctx = load(args.bench)
    te = load(args.te)[0] if args.te else {}
    shapes = sorted({key[:5] for key in km})
    head = "| E | k | logits | output | T | plain µs | fused µs | two-pass µs | fused / plain |"
    sep = "|---|---|---|---|---|---|---|---|---|"
    if te:
        head += " TE plain µs | TE fused µs | TE two-kernel µs | × TE fused | × TE two-kernel |"
        sep += "---|---|---|---|---|"
    print(head)
    print(sep)
    worst_plain, worst_te = 0.0, float("inf")
    for s in shapes:
        p, f, t = (km.get(s + (op,)) for op in ("plain", "fused", "two_pass"))
        if None in (p, f, t):
            continue
        row = f"| {s[0]} | {s[1]} | {s[2]} | {s[3]} | {s[4]} | {p:.1f} | {f:.1f} | {t:.1f} | {f / p:.2f} |"
        worst_plain = max(worst_plain, f / p)
        if te:
            tp, tf, tt = (te.get(s + (op,)) for op in ("plain", "fused", "two_pass"))
            if None not in (tp, tf, tt):
                row += f" {tp:.1f} | {tf:.1f} | {tt:.1f} | {tf / f:.2f} | {tt / t:.2f} |"
                if s[4] >= 16384:
                    worst_te = min(worst_te, tf / f, tt / t)
        print(row)
    hist = sorted((key[0], key[4], t) for key, t in km.items() if key[5] == "histogram")
    if hist:
        print()
        print("| E | T | histogram pass µs (qb_histogram_accumulate) |")
        print("|---|---|---|")
        for E, T, t in hist:
            print(f"| {E} | {T} | {t:.1f} |")
    print()
    if copy:
        print(f"device-to-device copy in the same run: {copy:.0f} GB/s (read + write)")
    print(f"fused / plain: at most {worst_plain:.2f} (target 1.30: {'met' if worst_plain <= 1.3 else 'missed'})")
    if te and worst_te != float("inf"):
        print(f"speedup over TE at T >= 16384, both modes: at least {worst_te:.2f} "
              f"(target 1.50: {'met' if worst_te >= 1.5 else 'missed'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
