#!/usr/bin/env python3
"""Old-vs-new device durations per native kernel from two Nsight Compute summaries.

gpu_router_ab.sh OLD NEW OUT ncutime writes OUT/ncutime_old.txt and OUT/ncutime_new.txt
(`ncu --metrics gpu__time_duration.sum --print-summary per-kernel`). This script joins them on kernel name and grid
size and prints min / average duration of each and the ratio of the averages:

    python3 perf_test/scripts/ncu_kernel_times.py OUT [OUT2 ...]
"""
import re
import sys

KERNEL = re.compile(r"\s+void (.*?) \((\d+), 1, 1\)x\((\d+), 1, 1\).*Invocations (\d+)")
METRIC = re.compile(r"\s+gpu__time_duration.sum\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
SCALE = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def parse(path):
    kernels, current = {}, None
    with open(path) as f:
        for line in f:
            m = KERNEL.match(line)
            if m:
                current = (m.group(1), m.group(2))
                kernels[current] = {"n": int(m.group(4))}
                continue
            m = METRIC.match(line.replace(",", ""))
            if m and current:
                s = SCALE[m.group(1)]
                kernels[current].update(min=float(m.group(2)) * s, avg=float(m.group(4)) * s)
    return kernels


def main(dirs):
    for d in dirs:
        old, new = parse(d + "/ncutime_old.txt"), parse(d + "/ncutime_new.txt")
        print("==", d)
        for key in sorted(set(old) | set(new)):
            row = f"{key[0]:58s} grid {key[1]:>5s}"
            for tag, k in (("old", old.get(key)), ("new", new.get(key))):
                row += f"  {tag} " + (f"min {k['min']:8.2f} avg {k['avg']:8.2f} us (n={k['n']:3d})" if k else " " * 38)
            if key in old and key in new:
                row += f"  new/old {new[key]['avg'] / old[key]['avg']:.3f}"
            print(row)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
