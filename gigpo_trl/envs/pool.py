"""EnvPool: many environment instances ("slots") stepped in-process, in worker processes, or in Ray actors.

The rollout collector owns one pool. ``reset(tasks, seeds)`` starts one episode per slot, ``step({slot:
action})`` steps some slots. Every call returns :class:`EnvResult` records; an environment that raises,
returns a bad value, exceeds ``step_timeout`` or whose worker dies produces an ``EnvResult`` with ``error``
set and ``done=True`` for the affected slots only, and the pool stays usable.

Backends:

- ``num_workers=0``: in this process, slots stepped one after another (no subprocess; ``step_timeout``
  cannot be enforced and is ignored).
- ``num_workers>=1``: worker processes (``multiprocessing`` "forkserver" context, "spawn" where forkserver is
  unavailable), one pipe each; slot ``i`` lives in worker ``i % num_workers``. A call sends one message per
  involved worker, the worker runs its slots' resets/steps sequentially and answers with one message.
  ``step_timeout`` bounds each single env call (``reset``, including creating the env the first time, or
  ``step``) and is measured in the parent while it waits. A hung or dead worker is killed and restarted with
  fresh env instances; every slot that lived in it loses its episode (the slots in the failing call get an
  error result right away, the others get "worker restarted" on their next ``step`` unless reset first). The
  error of the slot whose env call was running when the worker hung or died says so ("timed out", "worker
  process died"); the other slots of the call are told "worker restarted because another slot ... failed".
- ``backend="ray"``, ``num_workers>=1``: one Ray actor per worker instead of a process (needs
  ``pip install gigpo_trl[ray]``), each reserving one CPU wherever the cluster places it: the path for
  environments that outgrow one machine. A Ray instance already initialised in this process (``ray.init(...)``
  called by the user, with whatever address and ``runtime_env``) is used as is; otherwise the pool calls
  ``ray.init(address=ray_address)``: ``"auto"`` or ``"host:port"`` joins a cluster started with ``ray start``,
  ``"ray://host:10001"`` a remote one through Ray Client, and ``None`` lets Ray find a cluster through
  ``RAY_ADDRESS`` or start a local instance. The env factory (and ``gigpo_trl``) must be importable on every
  node. The timeout there bounds a whole worker message (``step_timeout`` times its number of slots), and every
  slot of a timed-out or dead actor fails with it (no per-slot progress counter). Actor start-up is waited for
  separately (like a worker process's), so it never counts as env time.

Every request to a worker carries an id that its reply repeats: a reply to a call that raised before its answers
came back (Ctrl-C, say) is dropped, never taken as the answer to a later call, and the slots of such a call report
their episode as lost until reset. A worker pickles each slot's result on its own and reads it back before sending:
a result the trainer could not receive (an ``info`` holding an exception whose class needs other constructor
arguments than its message pickles, but does not unpickle) fails that slot only, with an error naming the env class
(``env.unwrapped``'s, Gymnasium's convention), the slot, the task, the offending value and the pickling error.

Environments are created lazily by ``env_factory`` (one instance per slot, where the slot lives) and reused
across ``reset`` calls. With workers, the factory must be picklable (a class, a module-level function or a
``functools.partial`` of one), and a script that starts a pool with workers needs the usual
``if __name__ == "__main__":`` guard (workers are not forked from the parent, which may hold torch threads).
Importing this module imports no torch itself; workers are forked from a fork server that preloads it.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import itertools
import pickle
import signal
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait as _wait_connections
from typing import Any

from .base import env_anchor
from .checker import check_anchor, validate_reward

logger = logging.getLogger(__name__)

_STARTUP_TIMEOUT = 300.0  # seconds a new worker may take to import modules and unpickle the factory
_RESTARTED = "worker restarted"
_ABANDONED = "an earlier call on this slot raised before its results came back"
BACKENDS = ("process", "ray")  # where the workers run (num_workers >= 1); GiGPOConfig.env_backend takes these


@dataclass
class EnvResult:
    """Outcome of one ``reset`` or ``step`` of one slot.

    Attributes:
        observation: what the env returned (``None`` on error).
        reward (`float`): validated finite reward (0.0 for ``reset`` and on error).
        done (`bool`): episode over; always ``True`` when ``error`` is set.
        info (`dict`): the env's info dict.
        anchor (`Hashable`): ``env_anchor(env, observation)``, computed where the env lives.
        error (`str` or `None`): why the slot failed (env raised, timed out, bad return value, worker died).
    """

    observation: Any = None
    reward: float = 0.0
    done: bool = False
    info: dict = field(default_factory=dict)
    anchor: Hashable = None
    error: str | None = None


def _task_label(task: Any) -> str:
    text = repr(task)
    return text if len(text) <= 120 else text[:117] + "..."


def _error_result(message: str) -> EnvResult:
    return EnvResult(observation=None, reward=0.0, done=True, info={}, anchor=None, error=message)


class _SlotRunner:
    """Holds the env instances of some slots and runs reset/step on them, turning failures into results.

    Used directly by the in-process backend and inside every worker process / Ray actor.
    """

    def __init__(self, env_factory: Callable[[], Any], progress: Any = None):
        self.env_factory = env_factory
        self.progress = progress  # shared [item index, start time] array read by the parent for timeouts
        self.envs: dict[int, Any] = {}
        self.tasks: dict[int, Any] = {}
        self.active: set[int] = set()
        self.num_created = 0

    def run(self, kind: str, items: Sequence[tuple]) -> list[tuple[int, EnvResult]]:
        out = []
        for index, item in enumerate(items):
            if self.progress is not None:
                self.progress[1] = time.monotonic()
                self.progress[0] = index
            result = self.reset(*item) if kind == "reset" else self.step(*item)
            out.append((item[0], result))
        if self.progress is not None:
            self.progress[0] = -1
        return out

    def reset(self, slot: int, task: Any, seed: int | None) -> EnvResult:
        self.tasks[slot] = task
        self.active.discard(slot)
        where = f"slot {slot}, task {_task_label(task)}"
        try:
            env = self.envs.get(slot)
            if env is None:
                env = self.env_factory()
                self.num_created += 1
                self.envs[slot] = env
            out = env.reset(task, seed)
        except Exception as exc:  # noqa: BLE001 - any env failure becomes an error result
            self._discard(slot)
            return _error_result(f"{where}: reset raised {type(exc).__name__}: {exc}")
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
            self._discard(slot)
            return _error_result(f"{where}: reset must return (observation, info: dict), got {out!r:.200}")
        obs, info = out
        anchor, error = _anchor_of(env, obs, "reset")
        if error is not None:
            return _error_result(f"{where}: {error}")
        self.active.add(slot)
        return EnvResult(observation=obs, reward=0.0, done=False, info=info, anchor=anchor)

    def step(self, slot: int, action: str) -> EnvResult:
        task = self.tasks.get(slot)
        where = f"slot {slot}, task {_task_label(task)}"
        env = self.envs.get(slot)
        if env is None or slot not in self.active:
            return _error_result(f"{where}: no active episode in this slot; call reset first")
        try:
            out = env.step(action)
        except Exception as exc:  # noqa: BLE001
            self._discard(slot)
            return _error_result(f"{where}: step({action!r:.100}) raised {type(exc).__name__}: {exc}")
        if not (isinstance(out, tuple) and len(out) == 4 and isinstance(out[3], dict)):
            self.active.discard(slot)
            return _error_result(
                f"{where}: step must return (observation, reward, done, info: dict), got {out!r:.200}"
            )
        obs, reward, done, info = out
        try:
            reward = validate_reward(reward, f"{type(env).__name__}.step")
        except (TypeError, ValueError) as exc:
            self.active.discard(slot)
            return _error_result(f"{where}: {exc}")
        anchor, error = _anchor_of(env, obs, "step")
        if error is not None:
            self.active.discard(slot)
            return _error_result(f"{where}: {error}")
        return EnvResult(observation=obs, reward=reward, done=bool(done), info=info, anchor=anchor)

    def close(self) -> None:
        for slot in list(self.envs):
            self._discard(slot)

    def _discard(self, slot: int) -> None:
        """Drop a slot's env (after it raised, its state is unknown); the next reset builds a fresh one."""
        self.active.discard(slot)
        env = self.envs.pop(slot, None)
        if env is not None and hasattr(env, "close"):
            try:
                env.close()
            except Exception:  # noqa: BLE001
                pass


def _anchor_of(env: Any, obs: Any, method: str) -> tuple[Hashable, str | None]:
    """``(env_anchor(env, obs), None)``, or ``(None, message)`` when the observation/anchor is unusable."""
    try:
        check_anchor(env, obs, method)
        return env_anchor(env, obs), None
    except Exception as exc:  # noqa: BLE001 - TypeError from the check, anything from a user hook
        return None, f"{type(exc).__name__}: {exc}"


def env_name(env: Any) -> str:
    """The class name of the environment a user wrote: ``env.unwrapped``'s (Gymnasium's convention, which the TRL /
    OpenEnv adapters and the warm-up's expert wrapper follow), else ``env``'s own."""
    try:
        return type(env.unwrapped).__name__
    except Exception:  # noqa: BLE001 - no such attribute, or an adapter whose env cannot be built
        return type(env).__name__


def _encode_results(runner: _SlotRunner, results: list[tuple[int, EnvResult]]) -> list[tuple[int, str, bytes]]:
    """``[(slot, env class name, pickled EnvResult)]``: each result pickled on its own and read back here, so a value
    the trainer could not read (an exception in ``info`` whose class needs other constructor arguments pickles fine
    and fails in ``pickle.loads``) fails its own slot with a message naming the env, not the whole reply."""
    out = []
    for slot, result in results:
        env = runner.envs.get(slot)
        name = env_name(env) if env is not None else "env"
        try:
            payload = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.loads(payload)
        except Exception as exc:  # noqa: BLE001 - anything pickle raises for any user value
            where = f"slot {slot}, task {_task_label(runner.tasks.get(slot))}"
            runner.active.discard(slot)
            payload = pickle.dumps(_error_result(
                f"{where}: {name} returned a value the worker cannot send to the trainer ({_unsendable_part(result)}: "
                f"{type(exc).__name__}: {exc}); observation, info values and anchor must survive pickle.dumps and "
                "pickle.loads (store str(exc), not an exception whose __init__ takes other arguments than its message)"
            ))
        out.append((slot, name, payload))
    return out


def _unsendable_part(result: EnvResult) -> str:
    """Which part of ``result`` does not survive pickling: ``info['key']``, ``observation``, ``anchor`` or ``result``."""
    parts = [(f"info[{key!r}]", value) for key, value in result.info.items()] if isinstance(result.info, dict) else []
    for label, value in [("observation", result.observation), ("anchor", result.anchor), *parts]:
        try:
            pickle.loads(pickle.dumps(value))
        except Exception:  # noqa: BLE001
            return label
    return "result"


def _decode_results(replies: list[tuple[int, str, bytes]], slot_tasks: Sequence[Any]) -> dict[int, EnvResult]:
    """The worker's encoded results (see :func:`_encode_results`); one the trainer cannot unpickle (a class missing
    here, say) fails its own slot."""
    results = {}
    for slot, name, payload in replies:
        try:
            results[slot] = pickle.loads(payload)
        except Exception as exc:  # noqa: BLE001
            task = slot_tasks[slot] if slot < len(slot_tasks) else None
            results[slot] = _error_result(
                f"slot {slot}, task {_task_label(task)}: the trainer cannot read what {name} returned in the worker "
                f"({type(exc).__name__}: {exc}); observation, info values and anchor must unpickle in the trainer "
                "(classes importable there)"
            )
    return results


def _worker_main(conn, env_factory, progress) -> None:
    """Worker process loop: ``(request id, kind, items)`` in, ``(request id, encoded results)`` out (see
    :func:`_encode_results`), until "close" or EOF. The id lets the parent drop a reply to an older request."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business; it closes the pool
    runner = _SlotRunner(env_factory, progress)
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
        conn.send((request_id, _encode_results(runner, runner.run(kind, items))))


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


class EnvPool:
    """A pool of environment instances, one per slot.

    Args:
        env_factory (`Callable[[], Any]`): builds one environment (a ``TextEnv`` or any object with
            ``reset``/``step``). Must be picklable when ``num_workers > 0``.
        num_workers (`int`, defaults to 0): 0 steps all envs in this process; ``n >= 1`` runs them in ``n``
            worker processes (or Ray actors), slot ``i`` in worker ``i % n``.
        step_timeout (`float`, *optional*): seconds one env ``reset``/``step`` may take before its worker is
            killed and restarted (workers only).
        backend (`str`, defaults to `"process"`): ``"process"`` (worker processes on this machine) or ``"ray"``
            (Ray actors, on a cluster if Ray is connected to one; see the module docstring).
        ray_address (`str`, *optional*): ``ray.init(address=...)`` when ``backend="ray"`` and Ray is not yet
            initialised in this process (``"auto"``, ``"host:port"``, ``"ray://host:10001"``); ``None``: Ray's own
            lookup (``RAY_ADDRESS``, else a local instance). Ignored when Ray is already initialised.

    Raises:
        TypeError: ``env_factory`` is not callable, or cannot be pickled when ``num_workers > 0``.
        ValueError: a negative ``num_workers``, an unknown ``backend``, ``step_timeout <= 0``, or ``ray_address``
            with ``backend="process"``.
        ImportError: ``backend="ray"`` without the ``ray`` package.

    Example::

        from gigpo_trl.envs.frozenlake import FrozenLakeEnv

        with EnvPool(FrozenLakeEnv, num_workers=2, step_timeout=30) as pool:
            first = pool.reset([0, 0, 1, 1], [0, 0, 1, 1])
            results = pool.step({0: "down", 2: "right"})
    """

    def __init__(
        self,
        env_factory: Callable[[], Any],
        num_workers: int = 0,
        step_timeout: float | None = None,
        backend: str = "process",
        ray_address: str | None = None,
    ):
        if not callable(env_factory):
            raise TypeError(
                f"env_factory must be callable (an env class or a zero-argument function), got {env_factory!r}"
            )
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be 'process' or 'ray', got {backend!r}")
        if ray_address is not None and backend != "ray":
            raise ValueError(f"ray_address={ray_address!r} needs backend='ray', got backend={backend!r}")
        if step_timeout is not None and step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0 or None, got {step_timeout}")
        self.env_factory = env_factory
        self.num_workers = int(num_workers)
        self.step_timeout = step_timeout
        self.backend = backend
        self._closed = False
        self._slot_tasks: list[Any] = []
        self._slot_lost: list[str | None] = []  # why the slot's episode state is lost (worker restart, abandoned call)
        self._runner: _SlotRunner | None = None
        self._workers: list[Any] = []
        self._request_ids = itertools.count(1)  # every request to a worker has its own id; its reply carries it
        if backend == "ray":
            try:
                import ray  # noqa: F401
            except ImportError:
                raise ImportError(
                    "EnvPool(backend='ray') needs the optional Ray dependency: pip install gigpo_trl[ray]"
                ) from None
        if self.num_workers == 0:
            if step_timeout is not None:
                logger.info("EnvPool: step_timeout is not enforced with num_workers=0 (in-process envs)")
            self._runner = _SlotRunner(env_factory)
            return
        try:
            pickle.dumps(env_factory)
        except Exception as exc:  # noqa: BLE001
            raise TypeError(
                f"env_factory {env_factory!r} cannot be pickled ({type(exc).__name__}: {exc}); with num_workers > 0 "
                "pass the env class itself, a module-level function or a functools.partial, not a lambda or a "
                "local function"
            ) from None
        if backend == "ray":
            _connect_ray(ray_address)
            self._workers = [_RayWorker(i, env_factory) for i in range(self.num_workers)]
        else:
            self._ctx = _mp_context()
            self._workers = [_Worker(self._ctx, i, env_factory) for i in range(self.num_workers)]

    # ------------------------------------------------------------------ public API
    @property
    def num_slots(self) -> int:
        return len(self._slot_tasks)

    def reset(self, tasks: Sequence[Any], seeds: Sequence[int | None]) -> list[EnvResult]:
        """Start ``len(tasks)`` episodes; slot ``i`` gets ``tasks[i]``, ``seeds[i]``. Returns one result per slot."""
        self._check_open()
        tasks, seeds = list(tasks), list(seeds)
        if len(tasks) != len(seeds):
            raise ValueError(f"reset got {len(tasks)} tasks but {len(seeds)} seeds")
        while len(self._slot_tasks) < len(tasks):
            self._slot_tasks.append(None)
            self._slot_lost.append(None)
        for slot, task in enumerate(tasks):
            self._slot_tasks[slot] = task
            self._slot_lost[slot] = None
        items = [(slot, task, seed) for slot, (task, seed) in enumerate(zip(tasks, seeds))]
        results = self._run("reset", items)
        return [results[slot] for slot in range(len(tasks))]

    def step(self, actions: Mapping[int, str]) -> dict[int, EnvResult]:
        """Step the slots named in ``actions`` (in parallel across workers); other slots are untouched."""
        self._check_open()
        results: dict[int, EnvResult] = {}
        items = []
        for slot, action in actions.items():
            if not 0 <= slot < self.num_slots:
                raise ValueError(f"step got slot {slot}, but the pool has {self.num_slots} slots (reset first)")
            if self._slot_lost[slot]:
                where = f"slot {slot}, task {_task_label(self._slot_tasks[slot])}"
                results[slot] = _error_result(
                    f"{where}: {self._slot_lost[slot]}; the episode was lost (reset the slot to start a new one)"
                )
                logger.warning("EnvPool: %s", results[slot].error)
            else:
                items.append((slot, action))
        results.update(self._run("step", items))
        return {slot: results[slot] for slot in actions}

    def close(self) -> None:
        """Close all envs and stop the workers; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        if self._runner is not None:
            self._runner.close()
        for worker in self._workers:
            worker.close()
        self._workers = []

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def worker_pids(self) -> list[int | None]:
        """Process ids of the workers (process backend), for monitoring and tests."""
        return [getattr(w, "pid", None) for w in self._workers]

    def num_envs_created(self) -> int:
        """How many env instances ``env_factory`` has built so far (all workers together)."""
        if self._runner is not None:
            return self._runner.num_created
        total = 0
        for worker in self._workers:
            total += worker.count() if isinstance(worker, _RayWorker) else self._count(worker)
        return total

    # ------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("EnvPool is closed")

    def _run(self, kind: str, items: list[tuple]) -> dict[int, EnvResult]:
        if not items:
            return {}
        try:
            if self._runner is not None:
                results = dict(self._runner.run(kind, items))
            elif self.backend == "ray":
                results = self._run_ray(kind, items)
            else:
                results = self._run_processes(kind, items)
        except BaseException:
            # Interrupted (Ctrl-C, a bug): the envs may have run, the caller saw nothing; the slots' episodes are
            # lost until reset. A late reply is told apart by its request id.
            for item in items:
                self._slot_lost[item[0]] = _ABANDONED
            raise
        for result in results.values():
            if result.error is not None:
                logger.warning("EnvPool: %s", result.error)
        return results

    def _split(self, items: list[tuple]) -> dict[int, list[tuple]]:
        per_worker: dict[int, list[tuple]] = {}
        for item in items:
            per_worker.setdefault(item[0] % self.num_workers, []).append(item)
        return per_worker

    def _wait_ready(self, indices: Sequence[int]) -> None:
        """Block until the named workers finished starting; a worker that dies while starting is fatal."""
        pending = {self._workers[i].conn: i for i in indices if not self._workers[i].ready}
        deadline = time.monotonic() + _STARTUP_TIMEOUT
        while pending:
            ready = _wait_connections(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RuntimeError(f"EnvPool worker(s) {sorted(pending.values())} did not start in {_STARTUP_TIMEOUT}s")
            for conn in ready:
                index = pending.pop(conn)
                worker = self._workers[index]
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
        old = self._workers[index]
        logger.warning("EnvPool: restarting worker %d (pid %s): %s", index, old.pid, reason)
        old.kill()
        self._workers[index] = _Worker(self._ctx, index, self.env_factory)
        for slot in range(index, self.num_slots, self.num_workers):
            self._slot_lost[slot] = _RESTARTED

    def _run_processes(self, kind: str, items: list[tuple]) -> dict[int, EnvResult]:
        per_worker = self._split(items)
        self._wait_ready(list(per_worker))
        results: dict[int, EnvResult] = {}
        pending: dict[Any, int] = {}
        failed: dict[int, tuple[str, int | None]] = {}  # worker -> (reason, index of the item to blame)
        request_id = next(self._request_ids)
        for index, worker_items in per_worker.items():
            worker = self._workers[index]
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
                oldest = min(self._workers[i].progress[1] for i in pending.values())
                timeout = max(0.0, oldest + self.step_timeout - now) + 0.005
            for conn in _wait_connections(list(pending), timeout=timeout):
                index = pending.pop(conn)
                try:
                    reply_id, replies = conn.recv()
                except (EOFError, OSError):
                    self._workers[index].process.join(timeout=1)
                    code = self._workers[index].process.exitcode
                    # Died inside an env call: its progress counter names the slot to blame (else all of them).
                    blamed = int(self._workers[index].progress[0])
                    failed[index] = (f"worker process died (exit code {code})", blamed if blamed >= 0 else None)
                    continue
                except Exception as exc:  # noqa: BLE001 - an unreadable reply: the worker is replaced
                    failed[index] = (f"its reply could not be read ({type(exc).__name__}: {exc})", None)
                    continue
                if reply_id != request_id:  # the answer to a call that was abandoned (it raised): not this one's
                    logger.info("EnvPool: dropped worker %d's reply to abandoned request %s", index, reply_id)
                    pending[conn] = index
                    continue
                results.update(_decode_results(replies, self._slot_tasks))
            if self.step_timeout is not None:
                now = time.monotonic()
                for conn, index in list(pending.items()):
                    worker = self._workers[index]
                    if now - worker.progress[1] > self.step_timeout and not conn.poll():
                        worker.kill()  # stop it first so that the progress counter is final
                        blamed = int(worker.progress[0])
                        failed[index] = (f"timed out after {self.step_timeout}s", max(blamed, 0))
                        del pending[conn]
        for index, (reason, blamed) in failed.items():
            self._restart(index, reason)
            for position, item in enumerate(per_worker[index]):
                slot = item[0]
                task = self._slot_tasks[slot]
                if blamed is None or position == blamed:
                    why = f"{kind} failed: {reason}"
                else:
                    why = f"{_RESTARTED} because another slot of worker {index} failed ({reason})"
                results[slot] = _error_result(f"slot {slot}, task {_task_label(task)}: {why}")
        return results

    def _count(self, worker: _Worker) -> int:
        self._wait_ready([worker.index])
        request_id = next(self._request_ids)
        worker.conn.send((request_id, "count", None))
        while True:
            reply_id, count = worker.conn.recv()
            if reply_id == request_id:  # (a reply to an abandoned request is dropped)
                return int(count)

    # ------------------------------------------------------------------ Ray backend
    def _run_ray(self, kind: str, items: list[tuple]) -> dict[int, EnvResult]:
        import ray

        per_worker = self._split(items)
        for i in per_worker:  # actor start-up (a new process, imports, the factory) is not env time
            self._workers[i].wait_ready(_STARTUP_TIMEOUT)
        refs = {self._workers[i].submit(kind, worker_items): i for i, worker_items in per_worker.items()}
        timeout = None if self.step_timeout is None else self.step_timeout * max(len(v) for v in per_worker.values())
        done, not_done = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        results: dict[int, EnvResult] = {}
        failed: dict[int, str] = {}
        for ref in done:
            try:
                results.update(_decode_results(ray.get(ref), self._slot_tasks))
            except Exception as exc:  # noqa: BLE001 - RayActorError and friends
                failed[refs[ref]] = f"worker actor died ({type(exc).__name__}: {exc})"
        for ref in not_done:
            failed[refs[ref]] = f"timed out after {timeout}s"
        for index, reason in failed.items():
            logger.warning("EnvPool: restarting Ray worker %d: %s", index, reason)
            self._workers[index].restart()
            for slot in range(index, self.num_slots, self.num_workers):
                self._slot_lost[slot] = _RESTARTED
            for item in per_worker[index]:
                slot = item[0]
                results[slot] = _error_result(
                    f"slot {slot}, task {_task_label(self._slot_tasks[slot])}: {kind} failed: {reason}"
                )
        return results


def _connect_ray(address: str | None) -> None:
    """Use the Ray instance this process is connected to, as it is; else ``ray.init(address=address)`` (``None``:
    Ray's own lookup, ``RAY_ADDRESS`` or a new local instance)."""
    import ray

    if ray.is_initialized():
        if address is not None:
            logger.info("EnvPool: Ray is already initialised in this process; ray_address=%r is not used", address)
        return
    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)


class _RayWorker:
    """One Ray actor holding a ``_SlotRunner``."""

    def __init__(self, index: int, env_factory: Callable[[], Any]):
        import ray

        self.index = index
        self.env_factory = env_factory
        self._actor_class = ray.remote(num_cpus=1)(_RayRunner)
        self.actor = self._actor_class.remote(env_factory)
        self.ready = False
        self.pid = None

    def wait_ready(self, timeout: float) -> None:
        """Block until the actor answers (it has started and unpickled the factory); fatal if it cannot."""
        import ray

        if self.ready:
            return
        try:
            ray.get(self.actor.count.remote(), timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - GetTimeoutError, RayActorError, ...
            raise RuntimeError(
                f"EnvPool Ray worker {self.index} did not start ({type(exc).__name__}: {exc}); check that env_factory "
                "can be unpickled in a fresh process (defined in an importable module)"
            ) from None
        self.ready = True

    def submit(self, kind: str, items: list[tuple]):
        return self.actor.run.remote(kind, items)

    def count(self) -> int:
        import ray

        return ray.get(self.actor.count.remote())

    def restart(self) -> None:
        import ray

        try:
            ray.kill(self.actor)
        except Exception:  # noqa: BLE001
            pass
        self.actor = self._actor_class.remote(self.env_factory)
        self.ready = False

    def close(self) -> None:
        import ray

        try:
            ray.get(self.actor.close.remote(), timeout=10)
        except Exception:  # noqa: BLE001
            pass
        try:
            ray.kill(self.actor)
        except Exception:  # noqa: BLE001
            pass


class _RayRunner:
    def __init__(self, env_factory: Callable[[], Any]):
        self.runner = _SlotRunner(env_factory)

    def run(self, kind: str, items: list[tuple]) -> list[tuple[int, str, bytes]]:
        return _encode_results(self.runner, self.runner.run(kind, items))

    def count(self) -> int:
        return self.runner.num_created

    def close(self) -> None:
        self.runner.close()


__all__ = ["BACKENDS", "EnvPool", "EnvResult"]

