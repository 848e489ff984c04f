#!/usr/bin/python3
"""Turns bench/fence.sh's, bench/batch.sh's and bench/daemon.sh's measurements into
docs/benchmarks.md (markdown on stdout).

usage: report.py BENCH.tsv LAB_OUT_DIR

BENCH.tsv holds fence.sh's and batch.sh's rows, LAB_OUT_DIR/daemon.tsv daemon.sh's; either may be
missing (a run of some parts only), and its tables are left out.
"""
import collections
import os
import platform
import statistics
import subprocess
import sys


def read_tsv(path):
    """{(action, method, n): [values]} and the (action, method, n) of rows not verified."""
    rows = collections.defaultdict(list)
    unverified = []
    if not os.path.exists(path):
        return rows, unverified
    with open(path) as f:
        next(f)
        for line in f:
            action, method, n, value, verified = line.rstrip("\n").split("\t")
            rows[(action, method, int(n))].append(float(value))
            if verified != "yes":
                unverified.append((action, method, n))
    return rows, unverified


def main():
    tsv, lab_out = sys.argv[1:3]
    rows, unverified = read_tsv(tsv)
    daemon_rows, daemon_unverified = read_tsv(os.path.join(lab_out, "daemon.tsv"))
    unverified += daemon_unverified
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
    print("Produced by `bench/run` (do not edit by hand). Every run starts from the same state and "
          "its effect is verified afterwards with `sg_persist` through the fenced node's own I_T "
          "nexus.\n")
    print(f"- Host: {cpu}, {os.cpu_count()} cores, no KVM (qemu TCG), {platform.system()} {platform.release()}")
    print(f"- Guest: Debian's kernel {kernel}, 2 vCPUs, LIO fileio LUs on tmpfs")
    print("- Fabric: LIO iSCSI on 127.0.0.1, open-iscsi, one iface (initiator name) per node")
    print("- blkfencectl and blkfenced: release build, one batch for all LUs; sg_persist 1.46 in a "
          "shell loop; fence_scsi from fence-agents 4.12.1 (Debian 12)")
    print("\nUnder TCG every process start in the guest costs about 0.05-0.3 s, which dominates the "
          "loop and fence_scsi columns; on hardware all columns shrink, the loops and fence_scsi "
          "the most in absolute terms, but not below one process per command. TCG also emulates "
          "every guest instruction, so CPU time measured in the guest is several times what the "
          "same work costs on hardware.\n")

    goals = []
    if rows:
        fence_section(median, repeats, sizes, goals)
    if daemon_rows:
        daemon_section(daemon_rows, goals, lab_out)

    print("## Goals (docs/design.md §8)\n")
    if rows:
        print("`blkfencectl` is the whole command as an operator runs it (process start, sysfs "
              "discovery, ring set-up, the batch, output); `blkfencectl-batch` is the batch alone, "
              "from the first submission to the last completion, as blkfencectl's --json reports "
              "it. docs/design.md's reference figure (one io_uring batch on 16 LUs in 15-23 ms) is of "
              "the second kind.\n")
    for goal in goals:
        print(goal)
    if daemon_rows:
        print("\nHow to read the daemon goals. *Acquire*: the operation sends four batches one "
              "after the other (read keys and reservations, register, take, verify; the fifth "
              "step, removing other registrations, has nothing to do here), and the read and "
              "verify batches carry two commands per LU, so it costs about four raw round trips "
              "plus the daemon's own work per command and step, which TCG inflates like all CPU "
              "work (both sides are medians of noisy runs, and the raw RT is measured in a "
              "separate process, so a ratio somewhat below 4 is possible). *Detection*: a check that starts just before the "
              "preempt still reads the old state; the next one starts one check_interval after "
              "it, meets a unit attention (registrations preempted) on every LU, which the engine "
              "retries, and decides when its whole batch has answered: one check_interval plus "
              "about two round trips plus the time to submit the batch, so the goal's single "
              "round trip is tight by design, and the margin shrinks as the batch grows. *Monitor "
              "cost*: measured under TCG, so only a bound; the estimate divides by the slowdown of "
              "user code and leaves out that timer reads (and likely other system calls) are "
              "slowed down more.")
    if unverified:
        # One run writes several rows (methods, variants): count runs per action and size.
        per_variant = collections.Counter(unverified)
        runs = collections.Counter()
        for (action, method, n), c in per_variant.items():
            runs[(action, n)] = max(runs[(action, n)], c)
        print("\nRuns whose effect did not verify: " +
              ", ".join(f"{action} at {n} LUs ({c} run{'s' if c > 1 else ''})"
                        for (action, n), c in runs.items()) + ".")
        own = self_fenced(lab_out)
        if own:
            print(f"\nIn {own} detection run{'s' if own > 1 else ''} A's blkfenced reported itself "
                  "fenced with its *own* key as the holder (`fenced on ...: the reservation is held "
                  "by K ... key=K` in blkfenced-A.log, and `fenced_by` K): one check's READ "
                  "RESERVATION ran before B's preempt and its READ KEYS after it, so it found its "
                  "key gone while the reservation it had read still named it. The fence was "
                  "detected; who fenced it is misreported.")
    else:
        print("\nEvery run's effect verified.")


def fence_section(median, repeats, sizes, goals):
    print("Fence and unfence tables: wall-clock seconds, medians of "
          f"{' or '.join(map(str, repeats))} runs, process start included except in the "
          "`blkfencectl-batch` column: what an operator or a cluster manager waits for.\n")

    def table(action, title):
        methods = [m for m in ("blkfencectl", "sg_persist-loop", "fence_scsi", "blkfencectl-batch")
                   if any((action, m, n) in median for n in sizes)]
        if not methods:
            return
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

    for method in ("blkfencectl", "blkfencectl-batch"):
        n16 = ("preempt-abort", method, 16)
        f16 = ("preempt-abort", "fence_scsi", 16)
        if n16 in median and f16 in median:
            ratio = median[f16] / median[n16]
            goals.append(f"- Fence 16 LUs ≥ 100× faster than `fence_scsi -o off`, {method}: "
                         f"**{ratio:.0f}×** ({'met' if ratio >= 100 else 'not met'}).")
        b1, b64 = ("preempt-abort", method, 1), ("preempt-abort", method, 64)
        if b1 in median and b64 in median:
            ratio = median[b64] / median[b1]
            goals.append(f"- Fence 64 LUs within 3× of 1 LU, {method}: **{ratio:.2f}×** "
                         f"({'met' if ratio <= 3 else 'not met'}).")


def self_fenced(lab_out):
    """How many "fenced" records of blkfenced-A.log name the daemon's own key as the holder."""
    count = 0
    try:
        for line in open(os.path.join(lab_out, "blkfenced-A.log"), errors="replace"):
            if ": fenced: " in line and "held by " in line and " key=" in line:
                holder = line.split("held by ", 1)[1].split()[0]
                key = line.split(" key=", 1)[1].split()[0]
                count += holder == key
    except OSError:
        pass
    return count


def clocksource(lab_out):
    """The guest kernel's clocksource, from the lab's dmesg.log ("Switched to clocksource hpet")."""
    found = None
    try:
        for line in open(os.path.join(lab_out, "dmesg.log"), errors="replace"):
            if "Switched to clocksource" in line:
                found = line.split("Switched to clocksource", 1)[1].strip()
    except OSError:
        pass
    return found


def daemon_section(rows, goals, lab_out):
    """bench/daemon.sh's tables: acquire, detection, monitor CPU (docs/design.md §8, issue 4)."""
    med = {k: statistics.median(v) for k, v in rows.items()}
    most = {k: max(v) for k, v in rows.items()}
    sizes = sorted({k[2] for k in rows if k[0] == "raw-rt"} | {k[2] for k in rows if k[0].startswith("acquire-")})
    counts = sorted({len(v) for k, v in rows.items() if k[0].startswith(("acquire-", "detect-"))})
    raw_counts = sorted({len(v) for k, v in rows.items() if k[0] == "raw-rt"})
    modes = [(m, label) for m, label in (("preempt", "preempt"), ("preempt-abort", "preempt-and-abort"))
             if any(k[0] == "acquire-" + m for k in rows)]
    interval_ms = 250

    def ms(key, table=med):
        return f"{table[key] * 1000:.1f}" if key in table else "-"

    def raw(n):
        return med.get(("raw-rt", "blkfencectl-batch", n))

    print("## Daemon: acquire (exclusive mode, node B's blkfenced preempts node A's)\n")
    print("Node A's blkfenced holds resource `db` on the first N LUs; `blkfencectl acquire db` on "
          "node B takes it over: read keys and reservations, register, take (PREEMPT, or PREEMPT "
          "AND ABORT, of A's key), remove other registrations (nothing left here, so skipped), "
          "verify: four batches of commands, each over all N LUs at once. Each daemon uses only its "
          "own node's nexuses; check_interval 250 ms, keys_every 4. Milliseconds, medians of "
          f"{' or '.join(map(str, counts))} runs. *raw RT* is one READ RESERVATION batch over the "
          "same N LUs through B's nexuses (`blkfencectl device reservation --json`, its slowest "
          f"command, medians of {' or '.join(map(str, raw_counts))} runs, no daemon running): the "
          "goal's \"raw PR round trip\"; *raw, whole* is that command's whole wall-clock time. "
          "*blkfencectl* is the whole acquire command on B, process start included; *blkfenced* "
          "is the daemon's own duration of the operation (`elapsed_ms` of the reply). Every "
          "acquire is verified through A's nexuses: B's key is the only key and the holder on "
          "every LU.\n")
    head = ["LUs", "raw RT", "raw, whole"]
    for _, label in modes:
        head += [f"{label}: blkfencectl", "blkfenced", "blkfenced / raw RT"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for n in sizes:
        cells = [str(n), ms(("raw-rt", "blkfencectl-batch", n)), ms(("raw-rt", "blkfencectl", n))]
        for m, _ in modes:
            d = med.get((f"acquire-{m}", "blkfenced", n))
            cells += [ms((f"acquire-{m}", "blkfencectl", n)), ms((f"acquire-{m}", "blkfenced", n)),
                      f"{d / raw(n):.1f}×" if d and raw(n) else "-"]
        print("| " + " | ".join(cells) + " |")
    print()

    detect_variants = [("from-issue", "watch, from issue"), ("from-return", "watch, from return"),
                       ("from-daemon-start", "watch, from B's op start"),
                       ("from-daemon-end", "watch, from B's op end"),
                       ("gate-from-daemon-start", "A's log, from B's op start"),
                       ("gate-from-daemon-end", "A's log, from B's op end")]
    if any(k[0].startswith("detect-") for k in rows):
        print("## Daemon: detection on the fenced node\n")
        print("In the same runs, while node A is not frozen and its monitor reads the reservation "
              "every 250 ms: when A's blkfenced found itself fenced. *watch*: the `fenced` event "
              "as `blkfencectl watch db --json` on A delivers it, each line stamped with the "
              "guest's wall clock as it arrives; *A's log*: the wall-clock stamp of A's own "
              "`gate closed` log record. Counted "
              "from just before B's acquire command is issued (*from issue*), from its return "
              "(*from return*), and from the start and the end of the operation inside B's daemon "
              "(*B's op start/end*: the end is the stamp of B's `acquired` log record, the start "
              "`elapsed_ms` before it). B's PREEMPT takes effect inside B's operation, after its "
              "read and register batches and before its verify batch, so the true detection "
              "latency lies between the *op start* and *op end* columns; it can be negative from "
              "the op end when A's check falls between B's take and B's verify. *from issue* and "
              "*from return* include B's process start and exit (a few hundred milliseconds under "
              "TCG). Milliseconds, medians (max in parentheses); *goal* is one check_interval "
              "plus one raw RT. A run verifies when A's status afterwards is `fenced` with B's "
              "key as `fenced_by`.\n")
        lag = []
        for n in sizes:
            diffs = [w - g for m, _ in modes
                     for w, g in zip(rows.get((f"detect-{m}", "from-daemon-end", n), []),
                                     rows.get((f"detect-{m}", "gate-from-daemon-end", n), []))]
            if diffs:
                lag.append(f"{statistics.median(diffs) * 1000:.0f} ms at {n} LU{'s' if n > 1 else ''}")
        if lag:
            print("The watcher sees the `fenced` event after A's gate closed by (median) " +
                  ", ".join(lag) + ": the daemon encodes and sends two status events (`gate`, "
                  "then `fenced`), each carrying every LU, and blkfencectl decodes and prints them.\n")
        for m, label in modes:
            print(f"{label}:\n")
            present = [(v, t) for v, t in detect_variants if any((f"detect-{m}", v, n) in med for n in sizes)]
            head = ["LUs"] + [t for _, t in present] + ["goal"]
            print("| " + " | ".join(head) + " |")
            print("|" + "---:|" * len(head))
            for n in sizes:
                cells = [str(n)]
                for variant, _ in present:
                    key = (f"detect-{m}", variant, n)
                    cells.append(f"{ms(key)} ({ms(key, most)})" if key in med else "-")
                cells.append(f"{interval_ms + raw(n) * 1000:.1f}" if raw(n) else "-")
                print("| " + " | ".join(cells) + " |")
            print()

    cpu = sorted((k, v) for k, v in med.items() if k[0] == "monitor-cpu")
    host_loop, host_clock = host_reference()
    guest_loop = med.get(("cpu-reference", "python-loop", 0))
    guest_clock = med.get(("cpu-reference", "clock_gettime", 0))
    slow_loop = guest_loop / host_loop if guest_loop and host_loop else None
    slow_clock = guest_clock / host_clock if guest_clock and host_clock else None
    windows = [v for k, v in med.items() if k[0] == "monitor-window"]
    window = f"{min(windows):.0f} s" if windows else "fixed"
    if cpu:
        print("## Daemon: monitor cost\n")
        print("Node A's blkfenced alone, holding the resource on N LUs, checked at 4 Hz "
              "(check_interval 250 ms: READ RESERVATION of every LU in one batch, READ KEYS too "
              f"every 4th round); its utime + stime from /proc/PID/stat over a {window} window, as a "
              "percentage of one core (*kernel*: the stime part), with each transport. *checks/s* "
              "and *check latency* (mean time of one round) come from the daemon's metrics over "
              "the same window.\n")
        print("| transport | LUs | CPU, % of one core | of which kernel | checks/s | check latency (ms) |")
        print("|---|---:|---:|---:|---:|---:|")
        for (_, transport, n), value in cpu:
            rate = med.get(("checks-per-second", transport, n))
            kernel = med.get(("monitor-cpu-kernel", transport, n))
            print(f"| {transport} | {n} | {value:.2f} | {f'{kernel:.2f}' if kernel is not None else '-'} | "
                  f"{f'{rate:.2f}' if rate else '-'} | {ms(('check-latency', transport, n))} |")
        print()
        slow = []
        if slow_loop:
            slow.append(f"a pure Python loop runs **{slow_loop:.0f}×** slower in the guest than on "
                        f"the host ({guest_loop * 1000:.0f} ms against {host_loop * 1000:.0f} ms)")
        if slow_clock:
            source = clocksource(lab_out)
            why = (f": the guest kernel's clocksource is {source} (its TSC is unstable under TCG), "
                   "so every call is a system call and an emulated timer read instead of a vDSO "
                   "read" if source and source != "tsc" else "")
            slow.append(f"one `clock_gettime()` from Python costs **{guest_clock * 1e6:.1f} µs** in "
                        f"the guest against {host_clock * 1e6:.2f} µs on the host "
                        f"({slow_clock:.0f}×){why}")
        kernel_share = [med.get(("monitor-cpu-kernel", t, n), 0) / v for (_, t, n), v in cpu if v]
        print("**These CPU figures are measured under qemu TCG (no KVM) and are inflated relative "
              "to real hardware**: every guest instruction is emulated" +
              ("; " + "; ".join(slow) if slow else "") + ". " +
              (f"The kernel's share (system calls and the sg driver) is "
               f"{min(kernel_share) * 100:.0f}-{max(kernel_share) * 100:.0f}% of the daemon's time. "
               if kernel_share else "") +
              "Dividing by the loop's slowdown gives a rough estimate of the cost on this host's "
              "CPU (in the goals below), not a measurement.\n")

    # Goals.
    for m, label in modes:
        d, r = med.get((f"acquire-{m}", "blkfenced", 16)), raw(16)
        if d and r:
            ratio = d / r
            goals.append(f"- Acquire ({label}) of 16 LUs within 5× of one raw PR round trip (one "
                         f"round trip per step): blkfenced **{d * 1000:.1f} ms = {ratio:.1f}×** the "
                         f"raw RT of {r * 1000:.1f} ms, {ratio / 4:.1f}× per batch actually sent "
                         f"(4; two of them with 2 commands per LU) "
                         f"(**{'met' if ratio <= 5 else 'not met'}**).")
    for m, label in modes:
        for n in sizes:
            def bounds(prefix):
                lo = med.get((f"detect-{m}", prefix + "from-daemon-end", n))
                hi = med.get((f"detect-{m}", prefix + "from-daemon-start", n))
                hi_max = most.get((f"detect-{m}", prefix + "from-daemon-start", n))
                return lo, hi, hi_max
            lo, hi, hi_max = bounds("")
            if lo is None or hi is None or not raw(n):
                continue
            goal = interval_ms / 1000 + raw(n)
            if hi_max <= goal:
                verdict = "met in every run"
            elif hi <= goal:
                verdict = "met in the median, not in every run"
            elif lo <= goal:
                verdict = "undecided in the median: the goal lies between the bounds"
            else:
                verdict = "not met"
            glo, ghi, ghi_max = bounds("gate-")
            gate = (f"; A's gate closed (its log) between {glo * 1000:.0f} and {ghi * 1000:.0f} ms, "
                    f"at most {ghi_max * 1000:.0f}" if glo is not None and ghi is not None else "")
            goals.append(f"- Detection ({label}, {n} LU{'s' if n > 1 else ''}) within check_interval + one round trip "
                         f"({goal * 1000:.0f} ms): the watch saw `fenced` between "
                         f"{lo * 1000:.0f} and {hi * 1000:.0f} ms after B's preempt (medians of "
                         f"the bounds; upper bound at most {hi_max * 1000:.0f} ms){gate} "
                         f"(**{verdict}**).")
    for (_, transport, n), value in cpu:
        estimate = f", about {value / slow_loop:.2f}% after the loop's slowdown" if slow_loop else ""
        goals.append(f"- Monitor cost, {n} LUs at 4 Hz below 1% of one core, {transport}: "
                     f"**{value:.2f}%** measured under TCG{estimate} "
                     f"(**{'met' if value < 1 else 'not met as measured'}**"
                     f"{'' if value < 1 else '; TCG inflates CPU time, see above'}).")


def host_reference():
    """The guest's cpu-reference snippets (bench/daemon.sh), timed on this host: (loop, clock)."""
    def run(code):
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
            return float(out.stdout.strip())
        except (OSError, ValueError, subprocess.SubprocessError):
            return None
    loop = 'import time; t = time.perf_counter(); sum(range(3000000)); print("%.4f" % (time.perf_counter() - t))'
    clock = ('import time; c = time.clock_gettime; m = time.CLOCK_MONOTONIC; t = time.perf_counter()\n'
             'for _ in range(20000): c(m)\n'
             'print("%.9f" % ((time.perf_counter() - t) / 20000))')
    # The fastest of 3: other work on the host only ever slows a run down.
    return (min(filter(None, [run(loop) for _ in range(3)]), default=None),
            min(filter(None, [run(clock) for _ in range(3)]), default=None))

if __name__ == "__main__":
    main()
