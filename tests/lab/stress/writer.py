#!/usr/bin/env python3
"""A writer that keeps commands queued on one path: THREADS threads, each writing 4 KiB O_DIRECT
blocks to DEV one after another (blocks BLOCK0, BLOCK0+1, ... per thread, wrapping after 64), and
going on after a refused write. On SIGTERM it prints "writes OK REFUSED OTHER" and exits.
  usage: writer.py DEV BLOCK0 THREADS"""
import errno
import mmap
import os
import signal
import sys
import threading

dev, block0, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
counts = {"ok": 0, "refused": 0, "other": 0}
lock = threading.Lock()
stop = threading.Event()


def write_loop(index):
    fd = os.open(dev, os.O_WRONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)  # page aligned, as O_DIRECT needs
    buf.write(b"blkfence-lab stress writer %d" % index)
    seq = 0
    while not stop.is_set():
        block = block0 + index * 64 + seq % 64
        seq += 1
        try:
            os.pwrite(fd, buf, block * 4096)
            outcome = "ok"
        except OSError as e:
            outcome = "refused" if e.errno == errno.EBADE else "other"
        with lock:
            counts[outcome] += 1


signal.signal(signal.SIGTERM, lambda *_: stop.set())
workers = [threading.Thread(target=write_loop, args=(i,), daemon=True) for i in range(threads)]
for w in workers:
    w.start()
stop.wait()
print("writes %d %d %d" % (counts["ok"], counts["refused"], counts["other"]), flush=True)
