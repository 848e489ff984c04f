#!/usr/bin/python3
"""The lab's PostgreSQL clients for tests/lab/patroni (psycopg2 over libpq; one process each).

  client.py writer CONNINFO LOG STOP_FILE
      Inserts ids 1, 2, ... into t through CONNINFO (a libpq multi-host conninfo with
      target_session_attrs=read-write), one transaction each, and appends "ok ID" to LOG only
      after COMMIT returned; a failed or timed-out transaction appends "fail ID REASON" and the
      client reconnects. Stops when STOP_FILE exists.
  client.py stale CONNINFO STATE_FILE GO_FILE MARKER
      Opens a session, sets synchronous_commit = local, writes "ready" to STATE_FILE, waits for
      GO_FILE, then runs INSERT (id -1, MARKER) and COMMIT: writes "committed" or "error REASON".

Every wait on the server is bounded (TIMEOUT_S): a frozen server (SIGSTOP) still has its socket
acknowledged by the kernel, so TCP alone would wait forever. psycopg2 runs libpq in non-blocking
mode behind a wait callback, and this one gives up after the timeout.
"""
import os
import select
import sys
import time

import psycopg2
import psycopg2.extensions

TIMEOUT_S = float(os.environ.get("PGL_CLIENT_TIMEOUT_S", "4"))


class ClientTimeout(Exception):
    pass


def wait_bounded(conn):
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        state = conn.poll()
        if state == psycopg2.extensions.POLL_OK:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ClientTimeout(f"no answer within {TIMEOUT_S} s")
        if state == psycopg2.extensions.POLL_READ:
            select.select([conn.fileno()], [], [], remaining)
        elif state == psycopg2.extensions.POLL_WRITE:
            select.select([], [conn.fileno()], [], remaining)
        else:
            raise psycopg2.OperationalError(f"bad poll state {state}")


def connect(conninfo):
    """Connects without the wait callback: libpq then enforces connect_timeout on each host of a
    multi-host conninfo and moves on to the next (its non-blocking connect does not), so a frozen
    first host costs connect_timeout and not the whole attempt. Statements then run with it."""
    psycopg2.extensions.set_wait_callback(None)
    try:
        return psycopg2.connect(conninfo, connect_timeout=3)
    finally:
        psycopg2.extensions.set_wait_callback(wait_bounded)


def one_line(error):
    return " ".join(str(error).split()) or type(error).__name__


def writer(conninfo, log_path, stop_path):
    conn = None
    next_id = 1
    with open(log_path, "a", buffering=1) as log:
        while not os.path.exists(stop_path):
            try:
                if conn is None:
                    conn = connect(conninfo)
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO t (id, note) VALUES (%s, 'client')", (next_id,))
                conn.commit()
                log.write(f"ok {next_id} {time.time():.3f}\n")
            except Exception as error:  # every failure: record it, reconnect, carry on
                log.write(f"fail {next_id} {time.time():.3f} {one_line(error)}\n")
                try:
                    if conn is not None:
                        conn.close()
                except Exception:
                    pass
                conn = None
                time.sleep(0.2)
            next_id += 1


def stale(conninfo, state_path, go_path, marker):
    def state(text):
        with open(state_path + ".tmp", "w") as f:
            f.write(text + "\n")
        os.rename(state_path + ".tmp", state_path)

    try:
        conn = connect(conninfo)
        with conn.cursor() as cur:
            cur.execute("SET synchronous_commit = local")
        conn.commit()
    except Exception as error:
        state(f"error connecting: {one_line(error)}")
        return
    state("ready")
    while not os.path.exists(go_path):
        time.sleep(0.1)
    global TIMEOUT_S
    TIMEOUT_S = float(os.environ.get("PGL_STALE_TIMEOUT_S", "30"))
    try:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO t (id, note) VALUES (-1, %s)", (marker,))
        conn.commit()
        state("committed")
    except Exception as error:
        state(f"error {one_line(error)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["writer"] and len(sys.argv) == 5:
        writer(*sys.argv[2:])
    elif sys.argv[1:2] == ["stale"] and len(sys.argv) == 6:
        stale(*sys.argv[2:])
    else:
        sys.exit(__doc__)
