"""The learner's side of the hello: who may send, with which specs, and what they are told.

A hello names the peer's role, algorithm, chunk shape and model; the learner
refuses one that does not fit its config (the error text goes back to the
peer) and answers the rest with the trajectory and weights endpoints, the
agreed specs and the current weights, so a late joiner never waits for the
next broadcast. The model is built for the specs of the first hello accepted.
"""
from __future__ import annotations

import time
from typing import Callable

from zrl import checkpoint, spaces, wire
from zrl.config import Config
from zrl.learner.progress import Progress


class HelloRefused(Exception):
    """A hello the learner answers with an error (the text goes back to the peer)."""


class Handshake:
    """Answers hellos (the receiver thread calls `answer`). `build(obs_spec, action_spec)`
    makes the model for the first accepted hello's specs; `specs()` gives the agreed ones
    (None before); `latest()` the current (version, weights); `endpoints` what the reply names."""

    def __init__(self, config: Config, progress: Progress, instance: str, endpoints: dict[str, str],
                 build: Callable[[spaces.Spec, spaces.Spec], None], specs: Callable, latest: Callable, say: Callable[[str], None]):
        self.config = config
        self.progress = progress
        self.instance = instance
        self.endpoints = endpoints
        self.build = build
        self.specs = specs
        self.latest = latest
        self.say = say

    def answer(self, msg: wire.Message) -> bytes | bytearray:
        """The HELLO_REPLY frame for a hello, or HelloRefused."""
        try:
            hello, obs_spec, action_spec = wire.read_hello(msg, "learner")
        except wire.HelloInvalid as e:
            raise HelloRefused(str(e)) from None
        self._check(hello, obs_spec, action_spec)
        with self.progress.lock:
            self._agree(obs_spec, action_spec)
            index = hello.get("index", 0)
            if isinstance(index, int) and 0 <= index < 2**32:
                self.progress.senders[index] = time.monotonic()
            version, params = self.latest()
        agreed_obs, agreed_action = self.specs()
        reply = {
            "ok": True,
            "trajectory_endpoint": self.endpoints["trajectory"],
            "weights_endpoint": self.endpoints["weights"],
            "obs_space": agreed_obs.to_json(),
            "action_space": agreed_action.to_json(),
            "policy_version": version,
            "learner_instance": self.instance,
        }
        return wire.encode(wire.Kind.HELLO_REPLY, {"params": params}, reply, policy_version=version)

    def _check(self, hello: dict, obs_spec: spaces.Spec, action_spec: spaces.Spec) -> None:
        role = hello.get("role")
        if role not in ("actor", "server", "eval"):
            raise HelloRefused(f"unknown role {role!r} (expected actor, server or eval)")
        if hello.get("algo") != self.config.algo.name:
            raise HelloRefused(f"algorithm {hello.get('algo')!r} differs from the learner's {self.config.algo.name!r}")
        T = self.config.actor.unroll_length
        if role != "eval" and hello.get("unroll_length") != T:
            raise HelloRefused(f"unroll_length {hello.get('unroll_length')!r} differs from the learner's actor.unroll_length {T}")
        K = hello.get("num_envs")
        B = self.config.learner.batch_size
        if role != "eval" and (not isinstance(K, int) or K < 1):
            raise HelloRefused(f"num_envs {K!r} must be a positive int")
        if role != "eval" and self.config.algo.batch_source == "stream" and B % K != 0:
            # (Only a stream learner fills batches of columns: a replay samples them, and the
            # other sources take whole rollouts or gradients.)
            raise HelloRefused(f"num_envs {K!r} must divide the learner's batch_size {B}")
        want_hash = self.config.model_hash(obs_spec.to_json(), action_spec.to_json())
        if hello.get("model_hash") != want_hash:
            theirs, ours = hello.get("model"), self.config.model_shaping()["model"]
            diffs = [f"model.{k}: {theirs.get(k)!r} here, {ours.get(k)!r} on the learner" for k in sorted(set(theirs) | set(ours))
                     if theirs.get(k) != ours.get(k)] if isinstance(theirs, dict) else []
            raise HelloRefused(f"model config differs from the learner's ({'; '.join(diffs) or 'model_hash mismatch'}): "
                               "start actors with the learner's config")

    def _agree(self, obs_spec: spaces.Spec, action_spec: spaces.Spec) -> None:
        """Builds the model for the first hello's specs; refuses later ones that differ (lock held)."""
        agreed = self.specs()
        if agreed is None:
            try:
                self.build(obs_spec, action_spec)
            except checkpoint.CheckpointError:
                raise  # the run cannot go on (resuming a checkpoint of another model)
            except Exception as e:  # noqa: BLE001 - the specs are the peer's: refuse them, keep serving
                raise HelloRefused(f"cannot build the model for obs {obs_spec.to_json()} and actions "
                                   f"{action_spec.to_json()}: {e}") from None
            self.say(f"model built for obs {obs_spec.to_json()} and actions {action_spec.to_json()}")
        elif obs_spec != agreed[0] or action_spec != agreed[1]:
            raise HelloRefused(
                f"specs differ from the agreed ones: obs {obs_spec.to_json()} vs {agreed[0].to_json()}, "
                f"action {action_spec.to_json()} vs {agreed[1].to_json()}"
            )
