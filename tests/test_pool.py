import functools
import logging
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from gigpo_trl.envs.frozenlake import FrozenLakeEnv
from gigpo_trl.envs.pool import processes as pool_processes
from gigpo_trl.envs.pool import ray_actors
from gigpo_trl.envs.pool import EnvPool
from toy_env import FixedLengthEnv, SiteError, SiteFaultEnv

RAISE_TASK, HANG_TASK, NAN_TASK = 666, 777, 888


class TrickyEnv(FrozenLakeEnv):
    """FrozenLake that misbehaves on some tasks: raises, hangs or returns a NaN reward."""

    def step(self, action):
        if self.task == RAISE_TASK:
            raise RuntimeError("kaboom in step")
        if self.task == HANG_TASK:
            time.sleep(30)
        obs, reward, done, info = super().step(action)
        if self.task == NAN_TASK:
            reward = float("nan")
        return obs, reward, done, info


class CountingEnv(FrozenLakeEnv):
    created = 0

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        type(self).created += 1


class DictObsEnv(FrozenLakeEnv):
    """Returns a dict observation without defining anchor_state: not allowed."""

    def step(self, action):
        obs, reward, done, info = super().step(action)
        return {"grid": obs}, reward, done, info


class ListAnchorEnv(FrozenLakeEnv):
    """anchor_state returns an unhashable list: not allowed."""

    def anchor_state(self, observation):
        return observation.splitlines()


TASKS = [0, 1, 2, 3, 4, 5]
MOVES = ["right", "down", "down", "right", "left", "jump", "up", "right"]


def _trace(pool):
    out = [[(r.observation, r.reward, r.done, r.anchor) for r in pool.reset(TASKS, TASKS)]]
    for move in MOVES:
        results = pool.step({slot: move for slot in range(len(TASKS))})
        out.append([(r.observation, r.reward, r.done, r.anchor, r.error) for r in results.values()])
    return out


RAY = pytest.mark.ray


def _backend(request, backend):
    """The backend name; for "ray", the session's local Ray instance is started first (see conftest)."""
    if backend == "ray":
        request.getfixturevalue("ray_local")
    return backend


@pytest.mark.parametrize("backend", ["process", pytest.param("ray", marks=RAY)])
def test_in_process_and_workers_agree(request, backend):
    backend = _backend(request, backend)
    with EnvPool(FrozenLakeEnv, num_workers=0) as local:
        expected = _trace(local)
    with EnvPool(functools.partial(FrozenLakeEnv, size=4), num_workers=2, step_timeout=10, backend=backend) as pool:
        assert pool.num_slots == 0
        assert _trace(pool) == expected
        assert pool.num_slots == len(TASKS)
    first = expected[0][0]
    assert first[0] == first[3] == "P _ _ _\nO O _ _\n_ O O _\nO _ _ G"


@pytest.mark.parametrize("num_workers, backend", [(0, "process"), (2, "process"), pytest.param(2, "ray", marks=RAY)])
def test_env_raising_in_step_only_ends_its_slot(request, num_workers, backend, caplog):
    backend = _backend(request, backend)
    with EnvPool(TrickyEnv, num_workers=num_workers, step_timeout=10, backend=backend) as pool:
        pool.reset([0, RAISE_TASK, 2, 3], [0, 0, 0, 0])
        with caplog.at_level(logging.WARNING, logger="gigpo_trl.envs.pool"):
            results = pool.step({0: "right", 1: "right", 2: "down", 3: "down"})
        bad = results[1]
        assert bad.done and bad.error is not None
        assert str(RAISE_TASK) in bad.error and "kaboom in step" in bad.error
        assert any("kaboom" in rec.getMessage() for rec in caplog.records)
        assert all(results[s].error is None for s in (0, 2, 3))
        again = pool.step({0: "right", 2: "down", 3: "down"})
        assert all(r.error is None for r in again.values())
        # the failed slot can be reset and used again
        pool.reset([0, 1, 2, 3], [0, 0, 0, 0])
        assert pool.step({1: "down"})[1].error is None


def test_hanging_env_times_out_and_worker_restarts():
    # 2 s, not less: on a loaded machine a healthy slot's step can be descheduled for ~0.5 s and take the blame
    with EnvPool(TrickyEnv, num_workers=2, step_timeout=2.0) as pool:
        pool.reset([0, 1, HANG_TASK, 3], [0, 0, 0, 0])  # slots 0, 2 in worker 0; slots 1, 3 in worker 1
        pid0 = pool.worker_pids()[0]
        start = time.monotonic()
        results = pool.step({0: "right", 1: "down", 2: "down", 3: "down"})
        assert time.monotonic() - start < 10  # the hang lasts 30 s
        assert "timed out" in results[2].error and str(HANG_TASK) in results[2].error and results[2].done
        assert results[1].error is None and results[3].error is None  # other worker unaffected
        assert results[0].error is not None and "restarted" in results[0].error  # same worker: episode lost
        assert pool.worker_pids()[0] != pid0
        # untouched slots of the restarted worker would report the restart; after reset all is well
        results = pool.reset([0, 1, 2, 3], [0, 0, 0, 0])
        assert all(r.error is None for r in results)
        assert all(r.error is None for r in pool.step({s: "right" for s in range(4)}).values())


def test_killed_worker_gives_errors_then_recovers():
    with EnvPool(FrozenLakeEnv, num_workers=2, step_timeout=10) as pool:
        pool.reset([0, 1, 2, 3, 4], [0, 0, 0, 0, 0])  # worker 1 holds slots 1, 3
        os.kill(pool.worker_pids()[1], signal.SIGKILL)
        time.sleep(0.2)
        results = pool.step({0: "right", 1: "down"})
        assert results[0].error is None
        assert results[1].done and "died" in results[1].error and "task 1" in results[1].error
        # slot 3 lived in the dead worker too: its episode is gone
        lost = pool.step({3: "down"})[3]
        assert lost.done and "worker restarted" in lost.error
        results = pool.reset([0, 1, 2, 3, 4], [0, 0, 0, 0, 0])
        assert all(r.error is None for r in results)
        assert all(r.error is None for r in pool.step({1: "down", 3: "down"}).values())


@pytest.mark.parametrize("num_workers, backend", [(0, "process"), (1, "process"), pytest.param(1, "ray", marks=RAY)])
def test_nan_reward_and_bad_observation_are_error_results(request, num_workers, backend):
    backend = _backend(request, backend)
    with EnvPool(TrickyEnv, num_workers=num_workers, backend=backend) as pool:
        pool.reset([NAN_TASK, 0], [0, 0])
        results = pool.step({0: "right", 1: "right"})
        assert results[0].done and "finite" in results[0].error and str(NAN_TASK) in results[0].error
        assert results[1].error is None and results[1].reward == 0.0
    with EnvPool(DictObsEnv, num_workers=num_workers, backend=backend) as pool:
        pool.reset([0], [0])
        result = pool.step({0: "right"})[0]
        assert result.done and "must be str" in result.error and "anchor_state" in result.error
    with EnvPool(ListAnchorEnv, num_workers=num_workers, backend=backend) as pool:
        first = pool.reset([0], [0])[0]
        assert first.error is not None and "unhashable" in first.error and first.done
        assert "no active episode" in pool.step({0: "up"})[0].error


class NanAnchorEnv(FrozenLakeEnv):
    """Anchors hold the module constant math.nan (one object in-process, a fresh one after each pickling) and a
    zero whose sign depends on the seed: equal states must still share a key."""

    def reset(self, task, seed=None):
        self.zero = -0.0 if seed % 2 else 0.0
        return super().reset(task, seed)

    def anchor_state(self, observation):
        return (observation, math.nan, (self.zero, math.nan))


@pytest.mark.parametrize("num_workers, backend", [(0, "process"), (2, "process"), pytest.param(2, "ray", marks=RAY)])
def test_nan_anchors_group_the_same_in_process_and_in_workers(request, num_workers, backend):
    from gigpo_trl.advantage import compute_gigpo_advantages

    backend = _backend(request, backend)
    with EnvPool(NanAnchorEnv, num_workers=num_workers, backend=backend) as pool:
        anchors = [r.anchor for r in pool.reset([0, 0, 0, 0], [0, 1, 0, 1])]  # four copies of one start state
        anchors += [r.anchor for r in pool.step({0: "right", 1: "right", 2: "down", 3: "down"}).values()]
    res = compute_gigpo_advantages(rewards=np.arange(8.0), group_ids=[0] * 8, trajectory_ids=[0, 1, 2, 3] * 2,
                                   anchor_states=anchors)
    # turn 0: one state (4 rows); then "right" (slots 0, 1) and "down" (slots 2, 3): two states
    assert res.anchor_group_sizes.tolist() == [4, 4, 4, 4, 2, 2, 2, 2]
    ids = res.anchor_group_ids.tolist()
    assert ids[4] == ids[5] != ids[6] == ids[7]


SITE_ERROR = (
    "slot 0, task 3: SiteFaultEnv returned a value the worker cannot send to the trainer (info['error']: TypeError: "
    "SiteError.__init__() missing 1 required positional argument: 'detail'); observation, info values and anchor must "
    "survive pickle.dumps and pickle.loads (store str(exc), not an exception whose __init__ takes other arguments "
    "than its message)"
)


@pytest.mark.parametrize("backend", ["process", pytest.param("ray", marks=RAY)])
def test_reply_the_trainer_cannot_receive_fails_its_slot_only(request, backend):
    """An info holding an exception whose class needs two constructor arguments pickles in the worker but cannot be
    unpickled: that slot fails with an error naming the env class, slot, task, the value and the pickling error; the
    other slots (same worker and the other one) get their own answers, now and at the next step."""
    backend = _backend(request, backend)
    with EnvPool(SiteFaultEnv, num_workers=0) as local:  # in process nothing is pickled: the same env is fine
        local.reset([3, 3], [0, 0])
        assert isinstance(local.step({0: "site", 1: "wait"})[0].info["error"], SiteError)
    with EnvPool(SiteFaultEnv, num_workers=2, step_timeout=10, backend=backend) as pool:
        pids = pool.worker_pids()
        assert [r.observation for r in pool.reset([3, 3, 3, 3], [0, 0, 0, 0])] == ["3 turns left"] * 4
        results = pool.step({0: "site", 1: "wait", 2: "wait", 3: "wait"})
        assert results[0].error == SITE_ERROR and results[0].done
        assert [(results[s].observation, results[s].error) for s in (1, 2, 3)] == [("2 turns left", None)] * 3
        again = pool.step({1: "wait", 2: "wait", 3: "wait"})
        assert [(r.observation, r.reward, r.done) for r in again.values()] == [("1 turns left", 0.0, False)] * 3
        assert "no active episode" in pool.step({0: "wait"})[0].error  # its episode ended with the error
        assert pool.worker_pids() == pids  # nothing was restarted


def test_reply_to_an_abandoned_call_is_never_taken_for_a_later_one(monkeypatch):
    """A call interrupted while its workers are answering (Ctrl-C, here a patched wait) leaves replies in the pipes;
    each request carries an id, so the next call gets its own answers, and the interrupted slots report their episode
    lost until reset."""
    with EnvPool(FixedLengthEnv, num_workers=2, step_timeout=10) as pool:
        pool.reset([3, 3, 3], [0, 0, 0])
        real_wait = pool_processes._wait_connections

        def interrupted(connections, timeout=None):
            real_wait(connections, timeout=10)  # the replies are there
            raise KeyboardInterrupt

        monkeypatch.setattr(pool_processes, "_wait_connections", interrupted)
        with pytest.raises(KeyboardInterrupt):
            pool.step({0: "wait", 1: "wait"})
        monkeypatch.setattr(pool_processes, "_wait_connections", real_wait)
        lost = pool.step({0: "wait", 1: "wait", 2: "wait"})
        assert lost[0].error == ("slot 0, task 3: an earlier call on this slot raised before its results came back; "
                                 "the episode was lost (reset the slot to start a new one)")
        assert lost[1].done and "earlier call" in lost[1].error
        assert (lost[2].observation, lost[2].error) == ("2 turns left", None)  # not slot 0's stale "2 turns left"
        assert [r.observation for r in pool.reset([4, 5, 3], [0, 0, 0])] == ["4 turns left", "5 turns left",
                                                                             "3 turns left"]
        step = pool.step({0: "wait", 1: "wait", 2: "wait"})
        assert [r.observation for r in step.values()] == ["3 turns left", "4 turns left", "2 turns left"]
        assert pool.num_envs_created() == 3


def test_unpicklable_factory_rejected():
    with pytest.raises(TypeError, match="pickled"):
        EnvPool(lambda: FrozenLakeEnv(), num_workers=1)
    EnvPool(lambda: FrozenLakeEnv(), num_workers=0).close()  # fine in-process


def test_ray_backend_missing_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"gigpo_trl\[ray\]"):
        EnvPool(FrozenLakeEnv, num_workers=1, backend="ray")


@RAY
def test_ray_hanging_env_times_out_and_actor_restarts(ray_local):
    with EnvPool(TrickyEnv, num_workers=2, step_timeout=0.5, backend="ray") as pool:
        pool.reset([0, 1, HANG_TASK, 3], [0, 0, 0, 0])  # slots 0, 2 in actor 0; slots 1, 3 in actor 1
        actor0 = pool.workers.handles[0].actor
        start = time.monotonic()
        results = pool.step({0: "right", 1: "down", 2: "down", 3: "down"})
        # Ray bounds a whole actor message: 0.5 s x 2 slots; both slots of the hung actor fail, the other is fine
        assert time.monotonic() - start < 10
        assert "timed out after 1.0s" in results[2].error and str(HANG_TASK) in results[2].error and results[2].done
        assert "timed out" in results[0].error
        assert results[1].error is None and results[3].error is None
        assert pool.workers.handles[0].actor != actor0
        results = pool.reset([0, 1, 2, 3], [0, 0, 0, 0])
        assert all(r.error is None for r in results)
        assert all(r.error is None for r in pool.step({s: "right" for s in range(4)}).values())


@RAY
def _kill_and_wait_dead(ray, actor, timeout=60.0):
    """``ray.kill`` only sends the kill: under load the actor can still answer a call or two. Return once a call
    on it fails with the actor's death, so the test's next step meets a dead actor."""
    ray.kill(actor)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.count.remote(), timeout=5)
        except ray.exceptions.GetTimeoutError:
            continue
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError(f"actor still answers {timeout} s after ray.kill")


def test_ray_killed_actor_gives_errors_then_recovers(ray_local):
    with EnvPool(FrozenLakeEnv, num_workers=2, step_timeout=10, backend="ray") as pool:
        pool.reset([0, 1, 2, 3, 4], [0, 0, 0, 0, 0])  # actor 1 holds slots 1, 3
        _kill_and_wait_dead(ray_local, pool.workers.handles[1].actor)
        results = pool.step({0: "right", 1: "down"})
        assert results[0].error is None
        assert results[1].done and "worker actor died" in results[1].error and "task 1" in results[1].error
        lost = pool.step({3: "down"})[3]  # slot 3 lived in the dead actor too: its episode is gone
        assert lost.done and "worker restarted" in lost.error
        results = pool.reset([0, 1, 2, 3, 4], [0, 0, 0, 0, 0])
        assert all(r.error is None for r in results)
        assert all(r.error is None for r in pool.step({1: "down", 3: "down"}).values())


# ---------------------------------------------------------------------------------------------- Ray from the config
def test_config_and_job_flags_choose_the_env_backend(tmp_path):
    from gigpo_trl import GiGPOConfig
    from gigpo_trl.job import build_parser

    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    with pytest.raises(ValueError, match=r"^env_backend must be one of \['process', 'ray'\], got 'dask'$"):
        GiGPOConfig(**base, env_backend="dask")
    with pytest.raises(ValueError, match=r"^env_backend='ray' runs the environments in num_env_workers Ray actors; "
                                         r"set num_env_workers >= 1, got 0$"):
        GiGPOConfig(**base, env_backend="ray")
    with pytest.raises(ValueError, match=r"^ray_address='auto' needs env_backend='ray', got env_backend='process'$"):
        GiGPOConfig(**base, ray_address="auto")
    with pytest.raises(ValueError, match=r"^ray_address='auto' needs backend='ray', got backend='process'$"):
        EnvPool(FrozenLakeEnv, num_workers=1, ray_address="auto")
    _, args, _ = build_parser({"env": "frozenlake"}).parse_args_and_config(
        ["--output_dir", str(tmp_path), "--env_backend", "ray", "--num_env_workers", "3", "--ray_address",
         "ray://head:10001"])
    assert (args.env_backend, args.num_env_workers, args.ray_address) == ("ray", 3, "ray://head:10001")


def test_ray_address_goes_to_ray_init_unless_ray_is_initialised(monkeypatch):
    """No Ray is started: ``ray.init`` is replaced by a recorder that stops the pool right there."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install gigpo_trl[ray]): Ray backend untested")
    calls = []

    class Stop(Exception):
        pass

    def init(**kwargs):
        calls.append(kwargs)
        raise Stop

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(Stop):
        EnvPool(FrozenLakeEnv, num_workers=1, backend="ray", ray_address="ray://head:10001")
    with pytest.raises(Stop):
        EnvPool(FrozenLakeEnv, num_workers=1, backend="ray")  # None: Ray's lookup (RAY_ADDRESS, else local)
    assert [c["address"] for c in calls] == ["ray://head:10001", None]
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    ray_actors.connect_ray("ray://head:10001")  # an initialised Ray (the user's ray.init) is used as is
    assert len(calls) == 2


@RAY
def test_trainer_runs_its_envs_in_ray_actors_from_the_config(ray_local, tmp_path, tiny_model_dir, tiny_tokenizer,
                                                             monkeypatch):
    """``GiGPOConfig(env_backend="ray")``: the collector's pool steps the environments in Ray actors of the Ray
    instance this process already holds (``ray.init`` is not called again). Always "right" in corridors of
    (length, start) (3, 0), (4, 1), (6, 0), (5, 2) within 4 turns: wins in 2, 2, -, 2 turns."""
    import datasets
    from conftest import tiny_train_config as make_args
    from toy_env import LineWalkEnv

    from gigpo_trl import GiGPOTrainer

    monkeypatch.setattr(ray_local, "init", lambda *a, **k: pytest.fail("ray.init called with Ray initialised"))
    args = make_args(tmp_path, env_backend="ray", num_env_workers=2, per_device_eval_batch_size=4)
    trainer = GiGPOTrainer(tiny_model_dir, env=LineWalkEnv, args=args, processing_class=tiny_tokenizer)
    right = tiny_tokenizer.encode("<think>x</think><action>right</action>")
    trainer.collector.policy.generate_fn = lambda ids: ([right] * len(ids), None)
    try:
        metrics = trainer.evaluate(datasets.Dataset.from_dict({"task": [3, 4, 6, 5], "seed": [0, 1, 0, 2]}))
        pool = next(iter(trainer.collector.pools.values()))
        assert pool.backend == "ray" and pool.num_workers == 2
        assert pool.num_envs_created() == 4  # counted inside the actors
    finally:
        trainer.collector.close()
    assert metrics["eval_success_rate"] == 0.75 and metrics["eval_length_mean"] == 2.5
    assert metrics["eval_num_tasks"] == 4.0 and metrics["eval_failed_rate"] == 0.0


def test_envs_reused_across_resets_and_pool_grows():
    CountingEnv.created = 0
    pool = EnvPool(CountingEnv)
    pool.reset([0, 1], [0, 1])
    pool.reset([2, 3], [2, 3])
    assert CountingEnv.created == 2 and pool.num_envs_created() == 2
    pool.reset([0, 1, 2, 3], [0, 1, 2, 3])
    assert CountingEnv.created == 4 and pool.num_slots == 4
    results = pool.reset([5], [5])  # slots 1..3 stay idle, keep their episodes
    assert len(results) == 1 and pool.num_slots == 4
    assert pool.step({2: "down"})[2].error is None
    pool.close()
    pool.close()  # twice is fine
    with pytest.raises(RuntimeError):
        pool.reset([0], [0])
    with EnvPool(CountingEnv, num_workers=2) as workers:
        for _ in range(3):
            workers.reset([0, 1, 2], [0, 1, 2])
        assert workers.num_envs_created() == 3


def test_step_before_reset_and_unknown_slot():
    with EnvPool(FrozenLakeEnv) as pool:
        with pytest.raises(ValueError):
            pool.step({0: "up"})
        pool.reset([0], [0])
        assert pool.step({}) == {}


def test_pool_import_does_not_add_torch():
    code = (
        "import sys, gigpo_trl; before = set(sys.modules); import gigpo_trl.envs.pool; "
        "added = set(sys.modules) - before; print(sorted(m for m in added if m.split('.')[0] in ('torch', 'numpy')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
