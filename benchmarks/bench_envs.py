"""Environment throughput and EnvPool scaling.

    python benchmarks/bench_envs.py                      # everything
    python benchmarks/bench_envs.py --env frozenlake sokoban --steps 5000
    python benchmarks/bench_envs.py --env pool --pool-steps 30

Prints, for each env, steps/s in this process (random admissible actions; an episode is reset when it ends
or after the env's ``max_turns``), then
the EnvPool speed-up of 2 workers over 1 on a slow synthetic env (FrozenLake whose ``step`` also sleeps
``--slow-ms`` milliseconds, about ALFWorld's speed) and on ALFWorld when it can be built. Target: >= 1.8x with
2 workers. WebShop/ALFWorld that cannot be built print "unavailable: <reason>".
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gigpo_trl.envs.frozenlake import FrozenLakeEnv  # noqa: E402
from results_io import write_result  # noqa: E402

TARGET_SPEEDUP = 1.8


class SlowFrozenLake(FrozenLakeEnv):
    """FrozenLake whose step takes ``delay`` extra seconds (sleeping, or spinning the CPU with ``busy``)."""

    def __init__(self, delay: float = 0.02, busy: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.delay, self.busy = delay, busy

    def step(self, action):
        if self.busy:
            end = time.perf_counter() + self.delay
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(self.delay)
        return super().step(action)


def build_env(name: str):
    from gigpo_trl.envs import make_env

    return make_env(name)


def task_rows(env, limit: int = 1000):
    data = env.tasks("train")
    n = min(limit, len(data))
    return [(data[i]["task"], data[i].get("seed", i)) for i in range(n)]


def bench_single(name: str, steps: int) -> float | None:
    """Print one env's steps per second; return it (incl. resets), None when the env is unavailable."""
    try:
        start = time.perf_counter()
        env = build_env(name)
        rows = task_rows(env)
        build_s = time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - report and go on
        print(f"{name:<11} unavailable: {type(exc).__name__}: {exc}")
        return
    rng = random.Random(0)
    horizon = getattr(env, "max_turns", None) or 50  # the trainer cuts episodes here
    done, episodes, n, turn = True, 0, 0, 0
    info: dict = {}
    reset_s = 0.0
    start = time.perf_counter()
    try:
        while n < steps:
            if done or turn >= horizon:
                task, seed = rows[episodes % len(rows)]
                turn = 0
                t0 = time.perf_counter()
                _, info = env.reset(task, seed)
                reset_s += time.perf_counter() - t0
                episodes += 1
            actions = info.get("admissible_actions") or [env.invalid_action]
            _, _, done, info = env.step(rng.choice(actions))
            n += 1
            turn += 1
    except Exception as exc:  # noqa: BLE001
        print(f"{name:<11} unavailable: failed after {n} steps: {type(exc).__name__}: {exc}")
        return
    finally:
        getattr(env, "close", lambda: None)()
    total = time.perf_counter() - start
    step_s = total - reset_s
    print(
        f"{name:<11} {n / total:10.1f} steps/s incl. resets ({n / step_s:10.1f} steps/s step only, "
        f"{1000 * reset_s / max(episodes, 1):.2f} ms/reset, {n} steps, {episodes} episodes, built in {build_s:.2f}s)"
    )
    return round(n / total, 1)


def pool_rate(factory, rows, workers: int, slots: int, pool_steps: int, moves=None) -> tuple[float, float]:
    """(env steps/s over ``pool_steps`` batched pool.step calls, seconds to the first reset incl. startup).

    Steps every slot whose episode is running with a random admissible action (or one of ``moves``); when
    all episodes have ended, resets them all, as the rollout collector does.
    """
    from gigpo_trl.envs.pool import EnvPool

    rng = random.Random(0)
    chosen = [rows[i % len(rows)] for i in range(slots)]
    with EnvPool(factory, num_workers=workers, step_timeout=120) as pool:
        t0 = time.perf_counter()
        results = pool.reset([t for t, _ in chosen], [s for _, s in chosen])
        startup = time.perf_counter() - t0
        infos = {i: r.info for i, r in enumerate(results)}
        active = {i for i, r in enumerate(results) if not r.done}
        n = 0
        start = time.perf_counter()
        for _ in range(pool_steps):
            if not active:
                results = pool.reset([t for t, _ in chosen], [s for _, s in chosen])
                infos = {i: r.info for i, r in enumerate(results)}
                active = {i for i, r in enumerate(results) if not r.done}
            actions = {s: rng.choice(moves or infos[s].get("admissible_actions") or ["<invalid>"]) for s in active}
            out = pool.step(actions)
            n += len(out)
            for slot, r in out.items():
                infos[slot] = r.info
                if r.done:
                    active.discard(slot)
        elapsed = time.perf_counter() - start
    return n / elapsed, startup


def bench_pool(label: str, factory, rows, slots: int, pool_steps: int, moves=None) -> float:
    """Print the pool's env steps per second with 1 and 2 workers; return the speed-up."""
    rates = {}
    for workers in (1, 2):
        rate, startup = pool_rate(factory, rows, workers, slots, pool_steps, moves)
        rates[workers] = rate
        print(f"pool {label}: {workers} worker(s) {rate:8.1f} env steps/s ({slots} slots, first reset {startup:.2f}s)")
    speedup = rates[2] / rates[1]
    verdict = "ok" if speedup >= TARGET_SPEEDUP else "BELOW TARGET"
    print(
        f"pool {label}: speed-up 2 vs 1 workers = {speedup:.2f}x "
        f"(target >= {TARGET_SPEEDUP}x with 2 workers: {verdict})"
    )
    return round(speedup, 2)


def import_report() -> None:
    code = (
        "import sys, time; t = time.perf_counter(); import gigpo_trl.envs.pool; "
        "print(f'{time.perf_counter() - t:.2f}', 'torch' in sys.modules, 'numpy' in sys.modules)"
    )
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
        secs, torch_loaded, numpy_loaded = out.stdout.split()
        print(
            f"worker import chain: 'import gigpo_trl.envs.pool' takes {secs}s in a fresh process "
            f"(torch imported: {torch_loaded}, numpy imported: {numpy_loaded})"
        )
    except Exception as exc:  # noqa: BLE001
        print(f"worker import chain: could not measure ({type(exc).__name__}: {exc}; stderr: {out.stderr[-300:]!r})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--env",
        nargs="+",
        default=["all"],
        choices=["all", "frozenlake", "sokoban", "webshop", "alfworld", "pool"],
        help="what to benchmark ('pool' = EnvPool scaling on the slow synthetic env and ALFWorld)",
    )
    parser.add_argument("--steps", type=int, default=3000, help="env steps per single-process benchmark")
    parser.add_argument("--pool-steps", type=int, default=25, help="batched pool.step calls per pool benchmark")
    parser.add_argument("--slots", type=int, default=16, help="pool slots (parallel episodes)")
    parser.add_argument("--slow-ms", type=float, default=20.0, help="extra milliseconds per step of the slow env")
    parser.add_argument("--busy", action="store_true", help="slow env spins the CPU instead of sleeping")
    args = parser.parse_args()
    selected = set(args.env)
    if "all" in selected:
        selected = {"frozenlake", "sokoban", "webshop", "alfworld", "pool"}

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    rates, speedups = {}, {}
    for name in ("frozenlake", "sokoban", "webshop", "alfworld"):
        if name in selected:
            rates[name] = bench_single(name, args.steps)
    if "pool" in selected:
        import_report()
        slow = functools.partial(SlowFrozenLake, delay=args.slow_ms / 1000, busy=args.busy, max_turns=1000)
        rows = task_rows(FrozenLakeEnv())
        kind = "busy" if args.busy else "sleep"
        # "up"/"left" from the start cell never ends an episode, so every pool.step is a full batch
        label = f"slow-frozenlake ({args.slow_ms:g} ms {kind}/step)"
        speedups["slow-frozenlake"] = bench_pool(label, slow, rows, args.slots, args.pool_steps, moves=["up", "left"])
        try:
            from gigpo_trl.envs import get_env_class

            cls = get_env_class("alfworld")
            probe = cls()
            alf_rows = task_rows(probe, limit=args.slots)
            probe.close()
        except Exception as exc:  # noqa: BLE001
            print(f"pool alfworld: unavailable: {type(exc).__name__}: {exc}")
        else:
            speedups["alfworld"] = bench_pool("alfworld", cls, alf_rows, args.slots, max(5, args.pool_steps // 2))
    figures = {"steps_per_s_incl_resets": {k: v for k, v in rates.items() if v is not None}}
    if speedups:
        figures |= {"pool_speedup_2_vs_1_workers": speedups, "pool_speedup_target_min": TARGET_SPEEDUP}
    # the recorded figures: the default sizes (any --env subset merges into them)
    defaults = {k: v for k, v in vars(parser.parse_args([])).items() if k != "env"}
    write_result("bench_envs", figures, recorded=defaults == {k: v for k, v in vars(args).items() if k != "env"},
                 merge=True)


if __name__ == "__main__":
    main()
