#!/usr/bin/env python3
"""Summarise an Nsight Compute CSV of one profiled step (`ncu --csv --metrics gpu__time_duration.sum ...`).

Prints the number of kernels and the sum of their durations, then one line per kernel name (total, count,
mean, the first launch's grid and block), largest total first; with --list, every launch in order as well
(the step's kernels as they ran). scripts/gpu_profile_decode.sh makes the CSV.

usage: ncu_kernels.py CSV [--list]
"""
import collections
import csv
import sys


def launches(path: str) -> list:
    """(kernel name, duration in us, grid, block) per launch, in launch order."""
    with open(path, encoding="utf-8", errors="replace") as f:
        rows = [line for line in f if line.startswith('"')]  # ncu's own messages start with ==
    out = []
    for d in csv.DictReader(rows):
        if d.get("Metric Name") != "gpu__time_duration.sum":
            continue
        ns = float(d["Metric Value"].replace(",", ""))
        unit = d.get("Metric Unit", "ns")
        us = ns / 1e3 if unit in ("ns", "nsecond") else ns * 1e3 if unit in ("ms", "msecond") else ns
        out.append((d["Kernel Name"], us, d.get("Grid Size", ""), d.get("Block Size", "")))
    return out


def main(argv: list) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    ks = launches(argv[1])
    if not ks:
        print(f"{argv[1]}: no gpu__time_duration.sum rows (was the step profiled?)")
        return 1
    print(f"{len(ks)} kernels, {sum(k[1] for k in ks):.1f} us in all")
    by_name = collections.OrderedDict()
    for name, us, grid, block in ks:
        e = by_name.setdefault(name, [0, 0.0, grid, block])
        e[0] += 1
        e[1] += us
    for name, (n, us, grid, block) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        print(f"{us:10.1f} us {n:4d}x {us / n:8.2f} us  grid {grid:>14} block {block:>12}  {name[:100]}")
    if "--list" in argv:
        for name, us, grid, _ in ks:
            print(f"{us:9.2f} {grid:>14}  {name[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
