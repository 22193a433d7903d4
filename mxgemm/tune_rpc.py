"""`mxgemm tune --rpc`: the measure step on a fleet, through TVM's RPC tracker and servers.

The candidates are built here (:func:`mxgemm.tune.build`); each task (all candidates of one tune log key)
goes to a server the tracker hands out for the key: its kernels are uploaded, loaded there, checked
against the reference on that device and timed by :func:`mxgemm.tune.measure_task` (the code that
measures locally), and the timings come back. Workers run one session each, concurrently. A task whose
server dies, drops the connection or runs past the session timeout is put back and retried on the next
server the tracker gives; only tasks measured whole come back, so the log never gets a partial record.

A server is ``mxgemm rpc-server --tracker HOST:PORT --key KEY``: TVM's RPC server (``tvm.rpc.Server``),
with mxgemm's measure function registered in it. It needs the TVM runtime, torch and mxgemm; the
compiler is not needed there (runtime-only TVM serves).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mxgemm import tune, tunelog

log = logging.getLogger(__name__)
MEASURE_FUNC = "mxgemm.tune.measure"
SESSION_TIMEOUT = 900  # seconds a server may spend on one task before it is given up and retried
ATTEMPTS = 3  # sessions a task may take before the run fails


def parse_address(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` → (host, port); TuneError otherwise."""
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise tune.TuneError(f"--rpc wants the tracker as HOST:PORT, got {addr!r}")
    return host, int(port)


# ---- the server side -------------------------------------------------------------------------------


def _measure_here(payload: str) -> str:
    """The function a server runs: ``payload`` JSON ``{"task", "entries" (each with the uploaded file
    name in "file"), "seconds"}`` → JSON ``{"device", "us": [µs or None per entry]}``."""
    import tvm_ffi

    req = json.loads(payload)
    workpath = tvm_ffi.get_global_func("tvm.rpc.server.workpath")
    task = tune.Task(**req["task"])
    entries = [{**e, "path": str(workpath(e["file"]))} for e in req["entries"]]
    timed = dict((id(e), us) for e, us in tune.measure_task(task, entries, Path("/"), req["seconds"]))
    return json.dumps({"device": tune.device_name(task), "us": [timed.get(id(e)) for e in entries]})


def register() -> None:
    """Register :data:`MEASURE_FUNC` in this process (the server's init callback; its sessions are
    forked from it, so they see it)."""
    import tvm_ffi

    tvm_ffi.register_global_func(MEASURE_FUNC, _measure_here, override=True)


def serve(tracker: str, key: str, host: str = "0.0.0.0", port: int = 9090, port_end: int = 9199) -> None:
    """Run an RPC server registered with ``tracker`` under ``key`` until killed."""
    from tvm import rpc

    server = rpc.Server(
        host, port, port_end, tracker_addr=parse_address(tracker), key=key, server_init_callback=register
    )
    log.info("mxgemm rpc-server on %s:%d, key %s, tracker %s", host, server.port, key, tracker)
    server.proc.join()


# ---- the client side -------------------------------------------------------------------------------


def _remote_task(tracker: tuple[str, int], key: str, task: tune.Task, group: list[dict], root: Path,
                 seconds: float | None, session_timeout: float) -> tuple[str, list[float | None]]:
    """One session: upload ``group``'s kernels, measure them there; (device name, µs per entry)."""
    from tvm import rpc

    sess = rpc.connect_tracker(*tracker).request(key, priority=1, session_timeout=session_timeout)
    entries = []
    for i, e in enumerate(group):
        path = Path(e["path"]) if Path(e["path"]).is_absolute() else root / e["path"]
        name = f"candidate{i}{path.suffix}"
        sess.upload(str(path), target=name)
        entries.append({"file": name, "rule": e["rule"], "hints": e["hints"]})
    payload = json.dumps({"task": asdict(task), "entries": entries, "seconds": seconds})
    out = json.loads(str(sess.get_function(MEASURE_FUNC)(payload)))
    if len(out["us"]) != len(group):
        raise RuntimeError(f"the server answered {len(out['us'])} timings for {len(group)} candidates")
    return out["device"], out["us"]


def measure(
    kernel_dir: str | Path,
    tracker: str,
    key: str,
    workers: int = 1,
    seconds: float | None = None,
    progress=None,
    session_timeout: float = SESSION_TIMEOUT,
    attempts: int = ATTEMPTS,
) -> list[tunelog.Record]:
    """:func:`mxgemm.tune.measure` through the servers registered under ``key`` at ``tracker``
    (``HOST:PORT``), ``workers`` tasks at a time; records as there, also written to the kernel
    directory's measurements file. A task that fails on ``attempts`` sessions fails the run
    (TuneError naming it and the last error); nothing is written then."""
    addr = parse_address(tracker)
    root, by_task = tune.read_manifest(kernel_dir)
    todo: queue.Queue = queue.Queue()
    for task, group in by_task.items():
        todo.put((task, group, 1))
    done: dict[tune.Task, list[tunelog.Record]] = {}
    failed: list[str] = []
    lock = threading.Lock()
    open_tasks = [len(by_task)]

    def work() -> None:
        while True:
            with lock:
                if not open_tasks[0] or failed:
                    return
            try:
                task, group, attempt = todo.get(timeout=0.2)
            except queue.Empty:
                continue
            t0 = time.perf_counter()
            try:
                device, us = _remote_task(addr, key, task, group, root, seconds, session_timeout)
            except Exception as e:  # noqa: BLE001 (a lost server or session: retry the task elsewhere)
                reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
                log.warning("%s: attempt %d of %d failed: %s", task, attempt, attempts, reason)
                if attempt < attempts:
                    todo.put((task, group, attempt + 1))
                else:
                    with lock:
                        failed.append(f"{task}: {reason}")
                continue
            timed = [(e, t) for e, t in zip(group, us, strict=True) if t is not None]
            recs = tune.records(task, timed, device)
            log.info("%s measured on %s in %.1f s", task, device, time.perf_counter() - t0)
            with lock:
                done[task] = recs
                open_tasks[0] -= 1
            if progress:
                for r in recs:
                    progress(r)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(max(1, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise tune.TuneError(f"RPC measurement failed after {attempts} attempts: {failed[0]}")
    records = [r for task in by_task if task in done for r in done[task]]
    tune.write_measurements(root, records)
    return records


def tracker_summary(tracker: str) -> dict[str, Any]:
    """The tracker's view (queue and servers per key), for ``mxgemm tune --rpc`` errors."""
    from tvm import rpc

    return rpc.connect_tracker(*parse_address(tracker)).summary()
