#!/usr/bin/env python3
"""notify_listener.py SOCKET LOG: stands in for systemd's notify socket (sd_notify(3)).

Binds a datagram socket at SOCKET and appends one line per message part to LOG:
"EPOCHREALTIME PART" (e.g. "1733201234.567890 WATCHDOG=1"), flushed at once, until killed."""
import os
import socket
import sys
import time

path, log = sys.argv[1], sys.argv[2]
if os.path.exists(path):
    os.unlink(path)
server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
server.bind(path)
with open(log, "a", encoding="utf-8") as out:
    while True:
        message = server.recv(4096).decode("utf-8", "replace")
        stamp = f"{time.time():.6f}"
        for part in message.split("\n"):
            if part:
                out.write(f"{stamp} {part}\n")
        out.flush()
