"""Starting zrl's processes: the entry points of `zrl learner`, `zrl actor` and `zrl serve`
(roles), and `zrl run`, which supervises a learner and its actors on this machine
(supervisor, with the child processes in processes and summary.json in summary; its console
in banner, status, live and relay; the learner's progress records read in progress_tail).
zrl.training runs the same supervisor for `zrl.train`.

Importing this package is light (no torch): the cli imports it at start-up, and each entry
point imports what its role needs when it runs.
"""
from zrl.launch.options import RunOptions
from zrl.launch.roles import run_actor, run_learner, run_server
from zrl.launch.supervisor import LEARNER_STOP_S, Supervisor, run_local

__all__ = ["LEARNER_STOP_S", "RunOptions", "Supervisor", "run_actor", "run_learner", "run_local", "run_server"]
