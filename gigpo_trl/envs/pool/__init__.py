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

One module per concern: :mod:`.env_pool` (:class:`EnvPool`: the slots' tasks and lost episodes, the public calls),
:mod:`.base` (the result, the slot runner every backend uses, the :class:`WorkerBackend` interface) and one module per
backend, :mod:`.in_process`, :mod:`.processes` and :mod:`.ray_actors`.
"""

from .base import EnvResult, WorkerBackend
from .env_pool import BACKENDS, EnvPool

__all__ = ["BACKENDS", "EnvPool", "EnvResult", "WorkerBackend"]
