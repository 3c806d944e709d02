#!/usr/bin/env python3
# KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
"""Portable path against the specialization, and old against new, from the router benchmarks' JSON.

  python3 portable_ratios.py DIR
  python3 portable_ratios.py RUN.json [RUN.json ...]

DIR is a gpu_router_ab.sh bench folder: bench_old[.N].json and bench_new[.N].json (Google Benchmark JSON of the
router benchmarks, both implementations). Per portable case: the old and the new binary's CUDA-event device time
(device_us; the lower of the repetitions), their ratio, the new specialization's device time and portable /
specialization. Given JSON files instead, they are the repetitions of one binary and only its columns are printed.
"""

import glob
import json
import os
import sys


def load(path):
    with open(path) as f:
        d = json.load(f)
    return {b["name"].split("/min_time")[0]: b.get("device_us", 0.0) for b in d["benchmarks"]}


def best(runs, name):
    v = [r[name] for r in runs if name in r]
    return min(v) if v else 0.0


def main():
    if len(sys.argv) == 2 and os.path.isdir(sys.argv[1]):
        base = sys.argv[1]
        old = [load(f) for f in sorted(glob.glob(base + "/bench_old*.json"))]
        new = [load(f) for f in sorted(glob.glob(base + "/bench_new*.json"))]
    else:
        old, new = [], [load(f) for f in sys.argv[1:]]
    if old:
        print("%-48s %9s %9s %7s | %9s %9s" % ("case (device us)", "old", "new", "old/new", "spec new", "port/spec"))
    else:
        print("%-48s %9s %9s %9s" % ("case (device us)", "portable", "spec", "port/spec"))
    for name in sorted(new[0]):
        if "/portable/" not in name:
            continue
        o, n = best(old, name), best(new, name)
        a = best(new, name.replace("/portable/", "/auto/"))
        label = name.replace("router/", "").replace("/portable", "").replace("/warm", "")
        if old:
            print("%-48s %9.1f %9.1f %7.2f | %9.1f %9.2f" % (label, o, n, o / n if n else 0, a, n / a if a else 0))
        else:
            print("%-48s %9.1f %9.1f %9.2f" % (label, n, a, n / a if a else 0))


if __name__ == "__main__":
    main()
