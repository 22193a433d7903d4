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

import functools
import json
import logging
import queue
import re
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
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


class _MeasurerGone(RuntimeError):
    pass


class _Measurer:
    """A Python process, started fresh (not forked) by the server, that measures the tasks its sessions
    hand it (:func:`_serve_requests`: one JSON request per line in, one answer per line out).

    Sessions are not its parent, so they cannot wait on it (``poll()`` there reports any child as
    dead); a session learns that it is gone from the pipes."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def ask(self, req: dict) -> dict:
        """``req``'s answer; :class:`_MeasurerGone` if the process has died."""
        rid = uuid.uuid4().hex  # an answer left by a session that timed out is skipped
        try:
            self.proc.stdin.write(json.dumps({**req, "id": rid}) + "\n")
            self.proc.stdin.flush()
        except OSError as e:
            raise _MeasurerGone(f"the measuring process is gone ({e})") from None
        while line := self.proc.stdout.readline():
            ans = json.loads(line)
            if ans.pop("id", None) == rid:
                return ans
        raise _MeasurerGone("the measuring process died")


def _measure_here(payload: str, measurer: _Measurer | None = None) -> str:
    """The function a server runs: ``payload`` JSON ``{"task", "entries" (each with the uploaded file
    name in "file"), "seconds"}`` → JSON ``{"device", "us": [µs or None per entry]}``.

    The server forks each session from a process that has imported torch, and CUDA failed in such a
    child on the H100 (every session's first CUDA call raised), so the session hands the work to
    ``measurer``, the server's; where there is none or a crash took it down, to a fresh process of
    its own (5 s more: torch's import)."""
    import tvm_ffi

    req = json.loads(payload)
    workpath = tvm_ffi.get_global_func("tvm.rpc.server.workpath")
    req["entries"] = [{**e, "path": str(workpath(e["file"]))} for e in req["entries"]]
    ans = None
    if measurer is not None:
        try:
            ans = measurer.ask(req)
        except _MeasurerGone as e:
            log.warning("%s: measuring in a fresh process", e)
    if ans is None:
        run = subprocess.run(
            [sys.executable, "-m", __name__], input=json.dumps(req) + "\n", capture_output=True, text=True,
            check=False,
        )  # fmt: skip
        if run.returncode or not run.stdout.strip():
            raise RuntimeError(
                f"the measuring process failed (exit {run.returncode}): {error_line(run.stderr)}"
            )
        ans = json.loads(run.stdout.strip().splitlines()[-1])
    if "error" in ans:
        raise RuntimeError(ans["error"])
    return json.dumps(ans)


def _serve_requests(requests, answers) -> None:
    """The measuring process's loop: a JSON request per line of ``requests`` (entries with local paths in
    "path", plus an "id") → a line on ``answers``: ``{"id", "device", "us"}`` or ``{"id", "error"}``."""
    for line in requests:
        req = json.loads(line)
        try:
            task = tune.Task(**req["task"])
            us = tune.measure_task(task, req["entries"], Path.cwd(), req["seconds"])
            ans = {"device": tune.device_name(task), "us": us}
        except Exception:  # noqa: BLE001 (answered, the process lives on for the next session)
            ans = {"error": error_line(traceback.format_exc())}
        answers.write(json.dumps({**ans, "id": req.get("id")}) + "\n")
        answers.flush()


def error_line(text: str) -> str:
    """The line of a traceback or error text that says what went wrong: the last ``SomethingError:``
    line (CUDA errors end in advice lines), else the last non-empty line."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception)\b", ln)]
    return (errors or lines or ["(no message)"])[-1]


def register() -> None:
    """Register :data:`MEASURE_FUNC` and start the :class:`_Measurer` in this process (the server's init
    callback; its sessions are forked from it, so they see both)."""
    import tvm_ffi

    tvm_ffi.register_global_func(
        MEASURE_FUNC, functools.partial(_measure_here, measurer=_Measurer()), override=True
    )


def serve(tracker: str, key: str, host: str = "0.0.0.0", port: int = 9090, port_end: int = 9199) -> None:
    """Run an RPC server registered with ``tracker`` under ``key`` until killed."""
    from tvm import rpc

    server = rpc.Server(
        host, port, port_end, tracker_addr=parse_address(tracker), key=key, server_init_callback=register
    )
    log.info("mxgemm rpc-server on %s:%d, key %s, tracker %s", host, server.port, key, tracker)
    server.proc.join()


# ---- the client side -------------------------------------------------------------------------------


def _remote_task(
    tracker: tuple[str, int],
    key: str,
    task: tune.Task,
    group: list[dict],
    root: Path,
    seconds: float | None,
    session_timeout: float,
) -> tuple[str, list[float | None]]:
    """One session: upload ``group``'s kernels, measure them there; (device name, µs per entry)."""
    from tvm import rpc

    sess = rpc.connect_tracker(*tracker).request(key, priority=1, session_timeout=session_timeout)
    try:
        entries = []
        for i, e in enumerate(group):
            path = Path(e["path"]) if Path(e["path"]).is_absolute() else root / e["path"]
            name = f"candidate{i}{path.suffix}"
            sess.upload(str(path), target=name)
            entries.append({"file": name, "rule": e["rule"], "hints": e["hints"]})
        payload = json.dumps({"task": asdict(task), "entries": entries, "seconds": seconds})
        out = json.loads(str(sess.get_function(MEASURE_FUNC)(payload)))
    finally:
        # the session ends when its last reference goes, and the server serves no one else until then.
        # A retry inside request() leaves a reference cycle that holds this frame (its f_back) until
        # the garbage collector runs, which an idle client may not do for good: drop the session now.
        del sess
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
    (TuneError naming it and the last error); the tasks measured whole by then are written all the same
    (merge them, and a rerun skips them)."""
    addr = parse_address(tracker)
    root, by_task = tune.read_manifest(kernel_dir)
    check_fleet(tracker, key)
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
                if not servers(tracker, key):  # a request would wait for one forever
                    raise RuntimeError(f"no server left under key {key!r}")
                device, us = _remote_task(addr, key, task, group, root, seconds, session_timeout)
            except Exception as e:  # noqa: BLE001 (a lost server or session: retry the task elsewhere)
                reason = error_line(e) if str(e).strip() else type(e).__name__
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
    records = [r for task in by_task if task in done for r in done[task]]
    tune.write_measurements(root, records)
    if failed:
        raise tune.TuneError(
            f"RPC measurement failed after {attempts} attempts: {failed[0]} ({len(done)} of {len(by_task)} "
            f"tasks were measured whole; their records are in {root / tune.MEASUREMENTS})"
        )
    return records


def tracker_summary(tracker: str) -> dict[str, Any]:
    """The tracker's summary (``server_info``: the servers and their keys; ``queue_info``: free servers
    and pending requests per key); TuneError if it cannot be reached within 10 s."""
    from tvm import rpc

    addr = parse_address(tracker)
    try:
        socket.create_connection(addr, timeout=10).close()
    except OSError as e:
        raise tune.TuneError(f"cannot reach the RPC tracker at {tracker}: {e}") from None
    return rpc.connect_tracker(*addr).summary()


def check_fleet(tracker: str, key: str) -> None:
    """TuneError unless the tracker at ``tracker`` (``HOST:PORT``) answers and has a server under ``key``."""
    if not key:
        raise tune.TuneError("--rpc needs --rpc-key KEY, the key the servers registered under")
    if not servers(tracker, key):
        keys = sorted(s["key"].removeprefix("server:") for s in tracker_summary(tracker)["server_info"])
        raise tune.TuneError(f"no RPC server is registered under key {key!r} at {tracker} (keys: {keys})")


def servers(tracker: str, key: str) -> int:
    """How many servers (free or busy) are registered under ``key``."""
    return sum(s["key"] == f"server:{key}" for s in tracker_summary(tracker)["server_info"])


if __name__ == "__main__":  # the measuring process: the protocol owns stdout, anything printed goes to stderr
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    answers, sys.stdout = sys.stdout, sys.stderr
    _serve_requests(sys.stdin, answers)
