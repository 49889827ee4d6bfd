"""The process backend: the slots' environments in ``num_workers`` worker processes on this machine, one pipe each
(``multiprocessing`` "forkserver" context, "spawn" where forkserver is unavailable). ``step_timeout`` bounds each
single env call and is measured in the parent while it waits; a hung or dead worker is killed and restarted."""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait as _wait_connections
from typing import Any

from .base import (RESTARTED, STARTUP_TIMEOUT, EnvResult, SlotRunner, WorkerBackend, decode_results, encode_results,
                   error_result, split_by_worker, task_label)

logger = logging.getLogger(__name__)


def _worker_main(conn, env_factory, progress) -> None:
    """Worker process loop: ``(request id, kind, items)`` in, ``(request id, encoded results)`` out (see
    :func:`_encode_results`), until "close" or EOF. The id lets the parent drop a reply to an older request."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business; it closes the pool
    runner = SlotRunner(env_factory, progress)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            request_id, kind, items = conn.recv()
        except (EOFError, OSError):
            break
        if kind == "close":
            runner.close()
            try:
                conn.send((request_id, None))
            except OSError:
                pass
            break
        if kind == "count":
            conn.send((request_id, runner.num_created))
            continue
        conn.send((request_id, encode_results(runner, runner.run(kind, items))))


def _mp_context():
    """The "forkserver" context (falling back to "spawn"). The fork server is a fresh single-threaded process;
    preloading this module there means ``gigpo_trl`` (and whatever its ``__init__`` imports) is imported once
    and every worker forked from it starts in milliseconds instead of re-importing everything. The preload
    only takes effect if the fork server is not running yet."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", __name__])
    return ctx


class _Worker:
    """Parent-side handle of one worker process."""

    def __init__(self, ctx, index: int, env_factory: Callable[[], Any]):
        self.index = index
        self.progress = ctx.Array("d", 2, lock=False)
        self.progress[0], self.progress[1] = -1.0, time.monotonic()
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=_worker_main,
            args=(child_conn, env_factory, self.progress),
            name=f"gigpo-env-worker-{index}",
            daemon=True,
        )
        self.process.start()
        child_conn.close()  # so that the parent sees EOF when the child dies
        self.ready = False
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def kill(self) -> None:
        try:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(timeout=5)
        except Exception:  # noqa: BLE001
            pass
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass

    def close(self, timeout: float = 5.0) -> None:
        try:
            if self.process.is_alive():
                self.conn.send((-1, "close", None))
                if self.conn.poll(timeout):
                    self.conn.recv()
                self.process.join(timeout=timeout)
        except Exception:  # noqa: BLE001
            pass
        self.kill()


class ProcessBackend(WorkerBackend):
    """``num_workers`` worker processes (:class:`_Worker`); slot ``i`` lives in worker ``i % num_workers``. A call
    sends one message per involved worker, the worker runs its slots' resets/steps sequentially and answers with one
    message carrying the request's id (a reply to an abandoned request is dropped). ``step_timeout``: seconds one env
    ``reset`` (creating the env included) or ``step`` may take before its worker is killed and restarted."""

    def __init__(self, env_factory: Callable[[], Any], num_workers: int, step_timeout: float | None):
        self.env_factory = env_factory
        self.num_workers = num_workers
        self.step_timeout = step_timeout
        self._ctx = _mp_context()
        self.handles = [_Worker(self._ctx, i, env_factory) for i in range(num_workers)]
        self._request_ids = itertools.count(1)  # every request to a worker has its own id; its reply carries it

    def run(self, kind: str, items: list[tuple], slot_tasks: Sequence[Any]) -> tuple[dict[int, EnvResult], list[int]]:
        per_worker = split_by_worker(items, self.num_workers)
        self._wait_ready(list(per_worker))
        results: dict[int, EnvResult] = {}
        pending: dict[Any, int] = {}
        failed: dict[int, tuple[str, int | None]] = {}  # worker -> (reason, index of the item to blame)
        request_id = next(self._request_ids)
        for index, worker_items in per_worker.items():
            worker = self.handles[index]
            worker.progress[0], worker.progress[1] = -1.0, time.monotonic()
            try:
                worker.conn.send((request_id, kind, worker_items))
                pending[worker.conn] = index
            except (OSError, ValueError) as exc:
                failed[index] = (f"worker process died ({type(exc).__name__}: {exc})", None)
        while pending:
            timeout = None
            if self.step_timeout is not None:
                now = time.monotonic()
                oldest = min(self.handles[i].progress[1] for i in pending.values())
                timeout = max(0.0, oldest + self.step_timeout - now) + 0.005
            for conn in _wait_connections(list(pending), timeout=timeout):
                index = pending.pop(conn)
                try:
                    reply_id, replies = conn.recv()
                except (EOFError, OSError):
                    self.handles[index].process.join(timeout=1)
                    code = self.handles[index].process.exitcode
                    # Died inside an env call: its progress counter names the slot to blame (else all of them).
                    blamed = int(self.handles[index].progress[0])
                    failed[index] = (f"worker process died (exit code {code})", blamed if blamed >= 0 else None)
                    continue
                except Exception as exc:  # noqa: BLE001 - an unreadable reply: the worker is replaced
                    failed[index] = (f"its reply could not be read ({type(exc).__name__}: {exc})", None)
                    continue
                if reply_id != request_id:  # the answer to a call that was abandoned (it raised): not this one's
                    logger.info("EnvPool: dropped worker %d's reply to abandoned request %s", index, reply_id)
                    pending[conn] = index
                    continue
                results.update(decode_results(replies, slot_tasks))
            if self.step_timeout is not None:
                now = time.monotonic()
                for conn, index in list(pending.items()):
                    worker = self.handles[index]
                    if now - worker.progress[1] > self.step_timeout and not conn.poll():
                        worker.kill()  # stop it first so that the progress counter is final
                        blamed = int(worker.progress[0])
                        failed[index] = (f"timed out after {self.step_timeout}s", max(blamed, 0))
                        del pending[conn]
        for index, (reason, blamed) in failed.items():
            self._restart(index, reason)
            for position, item in enumerate(per_worker[index]):
                slot = item[0]
                if blamed is None or position == blamed:
                    why = f"{kind} failed: {reason}"
                else:
                    why = f"{RESTARTED} because another slot of worker {index} failed ({reason})"
                results[slot] = error_result(f"slot {slot}, task {task_label(slot_tasks[slot])}: {why}")
        return results, list(failed)

    def num_envs_created(self) -> int:
        return sum(self._count(worker) for worker in self.handles)

    def close(self) -> None:
        for worker in self.handles:
            worker.close()
        self.handles = []

    def _wait_ready(self, indices: Sequence[int]) -> None:
        """Block until the named workers finished starting; a worker that dies while starting is fatal."""
        pending = {self.handles[i].conn: i for i in indices if not self.handles[i].ready}
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while pending:
            ready = _wait_connections(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RuntimeError(f"EnvPool worker(s) {sorted(pending.values())} did not start in {STARTUP_TIMEOUT}s")
            for conn in ready:
                index = pending.pop(conn)
                worker = self.handles[index]
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    worker.kill()
                    raise RuntimeError(
                        f"EnvPool worker {index} died while starting (exit code {worker.process.exitcode}); "
                        "check that env_factory can be unpickled in a fresh process (defined in an importable module)"
                    ) from None
                if message[0] != "ready":
                    raise RuntimeError(f"EnvPool worker {index} sent {message!r} instead of 'ready'")
                worker.ready = True

    def _restart(self, index: int, reason: str) -> None:
        old = self.handles[index]
        logger.warning("EnvPool: restarting worker %d (pid %s): %s", index, old.pid, reason)
        old.kill()
        self.handles[index] = _Worker(self._ctx, index, self.env_factory)

    def _count(self, worker: _Worker) -> int:
        self._wait_ready([worker.index])
        request_id = next(self._request_ids)
        worker.conn.send((request_id, "count", None))
        while True:
            reply_id, count = worker.conn.recv()
            if reply_id == request_id:  # (a reply to an abandoned request is dropped)
                return int(count)
