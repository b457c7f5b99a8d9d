"""What the learner knows of its run: counters, returns, rejections, policy lag, the target.

`Progress` is shared by the receiver thread (env steps, episodes, rejections,
senders) and the training loop (updates, lag); every field is read and written
under its lock; zrl.learner.report turns a stretch of training into the
console line and TensorBoard's scalars.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

import numpy as np
import torch

from zrl import wire
from zrl.config import Config
from zrl.learner.senders import SenderTable
from zrl.protocol.limits import worth_logging

log = logging.getLogger("zrl.learner")

STATS_MAX_VALUES = 4096  # per array in one stats message
STATS_MAX_CUSTOM = 64
MAX_EPISODE_LENGTH = 2**40  # (summing 4096 of them stays exact in float64 and int64)  # distinct custom scalar names accepted (TensorBoard tags are not unbounded)


class Progress:
    def __init__(self, config: Config, stop_at_return: float | None):
        self.config = config
        self.stop_at_return = stop_at_return
        self.lock = threading.Lock()
        self.env_steps = 0
        self.updates = 0
        self.episodes = 0
        window = config.run.return_window
        self.returns: collections.deque[float] = collections.deque(maxlen=window)
        self.lengths: collections.deque[float] = collections.deque(maxlen=window)
        self.eval_returns: collections.deque[float] = collections.deque(maxlen=window)
        self.eval_episodes = 0
        # Which returns decide --stop-at-return and the summary: a greedy evaluation actor's
        # when the config has one (exploring actors of value-based methods cannot reach the
        # target on their own episodes), else the actors' own.
        self.return_source = "eval" if config.run.eval_actor else "train"
        self.rejected: collections.Counter[str] = collections.Counter()
        # Well-formed data the algorithm cannot use (a synchronous learner's chunks of an old
        # policy version, gradients too stale to apply): counted by reason, not rejected.
        self.discarded: collections.Counter[str] = collections.Counter()
        lc = config.learner
        self.senders = SenderTable(lc.max_senders, lc.actor_timeout_s, lc.new_senders_per_s, lc.new_senders_burst)
        self.custom: dict[str, float] = {}
        self.lag = LagStats()  # since the last log line
        self.run_lag = LagStats()  # the whole run
        self.reached_mean: float | None = None
        self.reached_at: float | None = None
        self.reached_unix: float | None = None

    # -- the receiver thread
    def reject(self, reason: str, detail: str) -> None:
        with self.lock:
            self.rejected[reason] += 1
            n = self.rejected[reason]
        if worth_logging(n):
            log.warning("rejected message (%s, %d so far): %s", reason, n, detail)

    def discard(self, reason: str, n: int = 1) -> None:
        with self.lock:
            self.discarded[reason] += n

    def received(self, sender_id: int, env_steps: int) -> bool:
        """Counts a chunk's (or gradient's) env steps; False (nothing counted) if the sender
        id is not one a hello reply handed out."""
        with self.lock:
            if not self.senders.heard(sender_id, env_steps):
                return False
            self.env_steps += env_steps
            return True

    def on_stats(self, msg: wire.Message) -> None:
        """Records an actor's STATS message (finished episodes, custom scalars); WireError if
        malformed, from an unknown sender, or implausible."""
        with self.lock:  # (the cheap check first: a flood of made-up ids costs a lookup each)
            known = msg.sender_id in self.senders
        if not known:
            raise wire.WireError(wire.Reason.UNKNOWN_SENDER, f"stats from sender id {msg.sender_id}, which no hello reply handed out")
        arrays = self._stats_arrays(msg)
        rets, lens = arrays.pop("episode_return", None), arrays.pop("episode_length", None)
        eval_rets, _ = arrays.pop("eval_return", None), arrays.pop("eval_length", None)
        if rets is not None and eval_rets is not None:
            raise wire.WireError(wire.Reason.BAD_VALUE, "stats with both training and eval returns: no sender sends both")
        with self.lock:
            if rets is not None or eval_rets is not None:
                self._check_stats_sender(msg.sender_id, lens, evaluating=eval_rets is not None)
            elif not self.senders.heard(msg.sender_id):
                raise wire.WireError(wire.Reason.UNKNOWN_SENDER, f"stats from sender id {msg.sender_id}, which no hello reply handed out")
            if rets is not None:
                self.returns.extend(rets.tolist())
                self.episodes += len(rets)
            if lens is not None:
                self.lengths.extend(lens.tolist())
            if eval_rets is not None:
                self.eval_returns.extend(eval_rets.tolist())
                self.eval_episodes += len(eval_rets)
            for name, a in arrays.items():
                if a.size and (name in self.custom or len(self.custom) < STATS_MAX_CUSTOM):
                    self.custom[name] = float(a[-1])

    def _stats_arrays(self, msg: wire.Message) -> dict[str, np.ndarray]:
        """A STATS message's arrays, checked: float64 vectors of finite values; returns and
        lengths in pairs of one size, returns within learner.max_abs_return (they can end the
        run through stop_at_return), lengths whole numbers in [1, 2^40]."""
        for info in msg.infos:
            if info.dtype != np.float64 or len(info.shape) != 1 or info.shape[0] > STATS_MAX_VALUES:
                raise wire.WireError(wire.Reason.BAD_SHAPE, f"stats array {info.name!r} must be float64 [n <= {STATS_MAX_VALUES}]")
        arrays = dict(msg.arrays)
        for name, a in arrays.items():
            if not np.all(np.isfinite(a)):
                raise wire.WireError(wire.Reason.BAD_VALUE, f"stats array {name!r} has non-finite values")
        for prefix in ("episode", "eval"):
            _check_episodes(prefix, arrays.get(f"{prefix}_return"), arrays.get(f"{prefix}_length"), self.config.learner.max_abs_return)
        return arrays

    def _check_stats_sender(self, sender_id: int, lengths: np.ndarray | None, evaluating: bool) -> None:
        """(lock held) A known sender of its role's returns, whose episodes span no more steps than it sent."""
        if sender_id not in self.senders:  # (its id was reused since the first look)
            raise wire.WireError(wire.Reason.UNKNOWN_SENDER, f"stats from sender id {sender_id}, which no hello reply handed out")
        if evaluating != (self.senders.role(sender_id) == "eval"):
            raise wire.WireError(wire.Reason.BAD_VALUE, f"sender {sender_id} ({self.senders.role(sender_id)}) sends "
                                 + ("training returns: only actors and agent servers do" if not evaluating else "eval returns: only an evaluation actor does"))
        steps = int(lengths.sum()) if lengths is not None else 0
        if not self.senders.episodes_plausible(sender_id, steps):
            raise wire.WireError(wire.Reason.BAD_VALUE, f"sender {sender_id} reports episodes of {steps} steps beyond the env steps it sent")
        self.senders.heard(sender_id)

    # -- the training loop
    def updated(self, versions) -> None:
        """One more update, on chunks acted by these policy versions (or None: unknown)."""
        with self.lock:
            self.updates += 1
            if versions is not None and len(versions):
                lag = (self.updates - 1) - np.asarray(versions, dtype=np.int64)
                self.lag.add(lag)
                self.run_lag.add(lag)

    def connected(self, now: float) -> int:
        """Senders with a hello heard from within learner.actor_timeout_s (call with the lock held)."""
        return self.senders.connected(now)

    def target_returns(self) -> collections.deque:
        return self.eval_returns if self.return_source == "eval" else self.returns

    def mean_return(self) -> float | None:
        with self.lock:
            r = self.target_returns()
            return float(np.mean(r)) if r else None

    def target_reached(self) -> bool:
        """True once the mean of the last return_window episodes reaches the target; the
        mean that did it is kept (`reached_mean`), since episodes keep arriving afterwards."""
        if self.stop_at_return is None:
            return False
        if self.reached_mean is not None:
            return True
        with self.lock:
            returns = self.target_returns()
            if len(returns) >= self.config.run.return_window:
                mean = float(np.mean(returns))
                if mean >= self.stop_at_return:
                    self.reached_mean, self.reached_at, self.reached_unix = mean, time.perf_counter(), time.time()
                    return True
        return False

    def restore(self, counters: dict[str, Any]) -> None:
        """Counters from a checkpoint (a resumed run goes on counting from them)."""
        self.updates, self.env_steps, self.episodes = int(counters["updates"]), int(counters["env_steps"]), int(counters["episodes"])
        self.returns.extend(counters.get("recent_returns", []))
        self.eval_returns.extend(counters.get("recent_eval_returns", []))

    def counters(self) -> dict[str, Any]:
        """The counters a checkpoint keeps."""
        with self.lock:
            return {
                "updates": self.updates,
                "env_steps": self.env_steps,
                "episodes": self.episodes,
                "recent_returns": list(self.returns),
                "recent_eval_returns": list(self.eval_returns),
            }

    def snapshot(self) -> dict[str, Any]:
        """What a log line shows, taken at once; the lag since the last line starts again."""
        with self.lock:
            lag, self.lag = self.lag, LagStats()
            return {
                "env_steps": self.env_steps,
                "updates": self.updates,
                "rejected": dict(self.rejected),
                "discarded": dict(self.discarded),
                "lag_mean": lag.mean(),
                "lag_max": lag.max if lag.n else None,
                "connected": self.connected(time.monotonic()),
                "mean_return": float(np.mean(self.returns)) if self.returns else None,
                "mean_length": float(np.mean(self.lengths)) if self.lengths else None,
                "n_returns": len(self.returns),
                "eval_return": float(np.mean(self.eval_returns)) if self.eval_returns else None,
                "n_eval": len(self.eval_returns),
                "episodes": self.episodes,
                "custom": dict(self.custom),
            }


def _check_episodes(prefix: str, returns: np.ndarray | None, lengths: np.ndarray | None, max_abs_return: float) -> None:
    """A pair of {prefix}_return and {prefix}_length arrays (or neither), plausible; WireError if not."""
    if returns is None and lengths is None:
        return
    if returns is None or lengths is None or returns.shape != lengths.shape:
        raise wire.WireError(wire.Reason.BAD_VALUE, f"stats need {prefix}_return and {prefix}_length together, of one size")
    if returns.size and np.abs(returns).max() > max_abs_return:
        raise wire.WireError(wire.Reason.BAD_VALUE, f"stats array '{prefix}_return' holds a return beyond +-{max_abs_return:g} (learner.max_abs_return)")
    if lengths.size and (lengths.min() < 1 or lengths.max() > MAX_EPISODE_LENGTH or np.any(lengths != np.floor(lengths))):
        raise wire.WireError(wire.Reason.BAD_VALUE, f"stats array '{prefix}_length' holds a length that is not a whole number in [1, 2^40]")


class LagStats:
    """Policy lag (updates between acting and training on a chunk): sum, count, max."""

    def __init__(self):
        self.sum, self.n, self.max = 0.0, 0, 0

    def add(self, lag: np.ndarray) -> None:
        self.sum += float(lag.sum())
        self.n += len(lag)
        self.max = max(self.max, int(lag.max()))

    def mean(self) -> float | None:
        return self.sum / self.n if self.n else None


class StatsSum:
    """An update's metrics summed as tensors and read only when logged: float() per update
    would synchronise with a GPU."""

    def __init__(self):
        self.sums: dict[str, Any] = {}
        self.n = 0

    def add(self, stats: dict[str, Any]) -> None:
        for k, v in stats.items():
            self.sums[k] = self.sums.get(k, 0.0) + (v.detach() if isinstance(v, torch.Tensor) else v)
        self.n += 1

    def means(self) -> dict[str, float]:
        return {k: float(v) / max(self.n, 1) for k, v in self.sums.items()}

    def clear(self) -> None:
        self.sums.clear()
        self.n = 0
