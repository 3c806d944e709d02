#!/usr/bin/env python3
# KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
"""KokkosMoE's router benchmarks on a host space against PyTorch's eager CPU reference, case by case.

  python3 host_vs_torch.py KOKKOSMOE.json TORCH.json

KOKKOSMOE.json: Google Benchmark JSON of KokkosMoE_RouterBenchmarks (mean real time per iteration; with
--benchmark_repetitions, the median of the repetitions);
TORCH.json: perf_test/reference/router_reference.py --device cpu (median per call). One line per case that both hold,
then the count of cases KokkosMoE is ahead in.
"""

import json
import sys

SCALE = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def main():
    with open(sys.argv[1]) as f:
        kk = json.load(f)
    with open(sys.argv[2]) as f:
        tt = json.load(f)
    ours = {}
    medians = any(b.get("aggregate_name") == "median" for b in kk["benchmarks"])
    for b in kk["benchmarks"]:
        if medians and b.get("aggregate_name") != "median":
            continue
        p = b["name"].split("/")  # router/<op>/<preset>/<dtype>/<impl>/<warm|cold>/T:<T>/...
        ours[(p[1], p[2], p[3], p[6])] = (b["real_time"] * SCALE[b["time_unit"]], b["iterations"])
    ahead = total = 0
    what = "median of the repetitions" if medians else "mean real time"
    print("time in ms; KokkosMoE: Google Benchmark %s; torch: median, eager" % what)
    for r in sorted(tt["results"], key=lambda r: (r["op"], r["preset"], r["dtype"])):
        key = (r["op"], r["preset"], r["dtype"], "T:%d" % r["T"])
        if key not in ours:
            continue
        us, it = ours[key]
        ratio = r["median_us"] / us
        total += 1
        ahead += ratio > 1.0
        print("%-12s %-12s %-6s kokkosmoe %9.2f (%5d it)  torch %9.2f  torch/kokkosmoe %5.2f %s" %
              (key[0], key[1], key[2], us / 1e3, it, r["median_us"] / 1e3, ratio, "ahead" if ratio > 1 else "BEHIND"))
    print("KokkosMoE ahead in %d of %d cases" % (ahead, total))


if __name__ == "__main__":
    main()
