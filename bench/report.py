#!/usr/bin/python3
"""Turns bench/fence.sh's measurements into docs/benchmarks.md (markdown on stdout).

usage: report.py BENCH.tsv LAB_OUT_DIR
"""
import collections
import os
import platform
import statistics
import sys


def main():
    tsv, lab_out = sys.argv[1:3]
    rows = collections.defaultdict(list)
    unverified = []
    with open(tsv) as f:
        next(f)
        for line in f:
            action, method, n, seconds, verified = line.rstrip("\n").split("\t")
            rows[(action, method, int(n))].append(float(seconds))
            if verified != "yes":
                unverified.append((action, method, n))
    median = {k: statistics.median(v) for k, v in rows.items()}
    repeats = sorted({len(v) for v in rows.values()})
    sizes = sorted({k[2] for k in rows})
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    kernel = "?"
    job = os.path.join(lab_out, "job.env")  # LAB_KMODS=.../kernel/<version>/lib/modules
    if os.path.exists(job):
        for line in open(job):
            if line.startswith("LAB_KMODS=") and "/kernel/" in line:
                kernel = line.split("/kernel/")[1].split("/")[0]

    print("# Benchmarks\n")
    print("Produced by `bench/run` (do not edit by hand). Wall-clock seconds, medians of "
          f"{' or '.join(map(str, repeats))} runs, process start included except in the "
          "`blkfencectl-batch` column: what an operator or a cluster manager waits for. "
          "Every run starts from the same state and its effect is verified afterwards with "
          "`sg_persist` through the fenced node's own I_T nexus.\n")
    print(f"- Host: {cpu}, {os.cpu_count()} cores, no KVM (qemu TCG), {platform.system()} {platform.release()}")
    print(f"- Guest: Debian's kernel {kernel}, 2 vCPUs, LIO fileio LUs on tmpfs")
    print("- Fabric: LIO iSCSI on 127.0.0.1, open-iscsi, one iface (initiator name) per node")
    print("- blkfencectl: release build, one batch for all LUs; sg_persist 1.46 in a shell loop; "
          "fence_scsi from fence-agents 4.12.1 (Debian 12)")
    print("\nUnder TCG every process start in the guest costs about 0.05-0.3 s, which dominates the "
          "loop and fence_scsi columns; on hardware all columns shrink, the loops and fence_scsi "
          "the most in absolute terms, but not below one process per command.\n")

    def table(action, title):
        methods = [m for m in ("blkfencectl", "sg_persist-loop", "fence_scsi", "blkfencectl-batch")
                   if any((action, m, n) in median for n in sizes)]
        print(f"## {title}\n")
        compared = [m for m in methods if m in ("sg_persist-loop", "fence_scsi")]
        extra = ["fence_scsi"] if "fence_scsi" in methods and "blkfencectl-batch" in methods else []
        print("| LUs | " + " | ".join(methods) + " | " +
              " | ".join([f"{m} / blkfencectl" for m in compared] +
                         [f"{m} / blkfencectl-batch" for m in extra]) + " |")
        print("|---:|" + "---:|" * (len(methods) + len(compared) + len(extra)))
        for n in sizes:
            def ratio(m, base_method):
                base = median.get((action, base_method, n))
                return f"{median[(action, m, n)] / base:.1f}×" if base and (action, m, n) in median else "-"
            cells = [f"{median[(action, m, n)]:.3f}" if (action, m, n) in median else "-" for m in methods]
            ratios = [ratio(m, "blkfencectl") for m in compared] + [ratio(m, "blkfencectl-batch") for m in extra]
            print(f"| {n} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
        if ("blkfencectl" in methods) and sizes[0] in [k[2] for k in median if k[0] == action]:
            first, last = median.get((action, "blkfencectl", sizes[0])), median.get((action, "blkfencectl", sizes[-1]))
            if first and last:
                print(f"\nblkfencectl at {sizes[-1]} LUs takes {last / first:.2f}× its time at {sizes[0]}.")
        print()

    table("preempt-abort", "Fence: PREEMPT AND ABORT of node A's key (fence_scsi -o off)")
    table("preempt", "Fence: PREEMPT of node A's key")
    table("unfence", "Unfence: register node B's key on every LU (fence_scsi -o on)")

    print("## Goals (DESIGN.md §8)\n")
    print("`blkfencectl` is the whole command as an operator runs it (process start, sysfs discovery, "
          "ring set-up, the batch, output); `blkfencectl-batch` is the batch alone, from the first "
          "submission to the last completion, as blkfencectl's --json reports it. DESIGN.md's "
          "reference figure (one io_uring batch on 16 LUs in 15-23 ms) is of the second kind.\n")
    for method in ("blkfencectl", "blkfencectl-batch"):
        n16 = ("preempt-abort", method, 16)
        f16 = ("preempt-abort", "fence_scsi", 16)
        if n16 in median and f16 in median:
            ratio = median[f16] / median[n16]
            print(f"- Fence 16 LUs ≥ 100× faster than `fence_scsi -o off`, {method}: **{ratio:.0f}×** "
                  f"({'met' if ratio >= 100 else 'not met'}).")
        b1, b64 = ("preempt-abort", method, 1), ("preempt-abort", method, 64)
        if b1 in median and b64 in median:
            ratio = median[b64] / median[b1]
            print(f"- Fence 64 LUs within 3× of 1 LU, {method}: **{ratio:.2f}×** "
                  f"({'met' if ratio <= 3 else 'not met'}).")
    if unverified:
        print("\nRuns whose effect did not verify: " + ", ".join(" ".join(u) for u in unverified))
    else:
        print("\nEvery run's effect verified.")


if __name__ == "__main__":
    main()
