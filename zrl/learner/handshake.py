"""The learner's side of the hello: who may send, with which specs, and what they are told.

The learner knows its observation and action specs from its config and env
before any peer connects (`zrl.envs.specs.config_specs`, or the checkpoint it
resumes), so a hello never decides the model: a hello whose role, algorithm,
chunk shape, specs or model differ from the learner's is refused with a short
error that names the first difference. An accepted hello gets a sender id
(`zrl.learner.senders`), the trajectory and weights endpoints, and, when its
id is new, the current weights as a second frame: the frame the publisher
sent last, shared by every reply of that version, so replies that peers never
read cost no copy of the weights each.
"""
from __future__ import annotations

import collections
from typing import Callable

from zrl import spaces, wire
from zrl.config import Config
from zrl.learner.progress import Progress
from zrl.learner.senders import SenderRefused

MAX_NUM_ENVS = 1 << 16


class HelloRefused(Exception):
    """A hello the learner answers with an error (the text goes back to the peer); `reason`
    is the counted reason."""

    def __init__(self, text: str, reason: str = "hello_refused"):
        super().__init__(wire.short(text))
        self.reason = reason


class Handshake:
    """Answers hellos (the receiver thread calls `answer`). `specs` are the learner's
    (obs, action); `latest_frame()` gives the (version, WEIGHTS frame) published last;
    `endpoints` are what the reply names."""

    def __init__(self, config: Config, progress: Progress, instance: str, endpoints: dict[str, str],
                 specs: tuple[spaces.Spec, spaces.Spec], latest_frame: Callable[[], tuple[int, object]]):
        self.config = config
        self.progress = progress
        self.instance = instance
        self.endpoints = endpoints
        self.obs_spec, self.action_spec = specs
        self.model_hash = config.model_hash(self.obs_spec.to_json(), self.action_spec.to_json())
        self.latest_frame = latest_frame
        # The id last handed to each routing identity (bounded, oldest out): a peer that says
        # hello again on one connection without claiming its id gets it back, not a new one.
        self.by_identity: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        # Episodes an actor may report before their steps arrive: up to two chunks per env in
        # flight. None: unchecked (actor.backpressure drop: an actor's dropped chunks never arrive).
        T, K = config.actor.unroll_length, config.actor.num_envs
        self.slack_steps = 2 * K * (T + 1) if config.actor.backpressure == "block" else None

    def answer(self, msg: wire.Message, identity: bytes = b"") -> list:
        """The frames of the reply to a hello: HELLO_REPLY, and the weights for a new sender
        id. HelloRefused says why not."""
        try:
            hello, obs_spec, action_spec = wire.read_hello(msg, "learner")
        except wire.HelloInvalid as e:
            raise HelloRefused(str(e)) from None
        role = self._check(hello, obs_spec, action_spec)
        claimed = msg.sender_id or self.by_identity.get(identity, 0)
        with self.progress.lock:
            try:
                sender_id, new = self.progress.senders.admit(claimed, role, slack_steps=self.slack_steps)
            except SenderRefused as e:
                raise HelloRefused(wire.BUSY + str(e), e.reason) from None
        self._remember(identity, sender_id)
        version, weights = self.latest_frame()
        reply = {
            "ok": True,
            "sender_id": sender_id,
            "trajectory_endpoint": self.endpoints["trajectory"],
            "weights_endpoint": self.endpoints["weights"],
            "obs_space": self.obs_spec.to_json(),
            "action_space": self.action_spec.to_json(),
            "policy_version": version,
            "learner_instance": self.instance,
            "weights_included": new,
        }
        frames = [wire.encode(wire.Kind.HELLO_REPLY, meta=reply, sender_id=sender_id, policy_version=version)]
        return frames + [weights] if new else frames

    def _remember(self, identity: bytes, sender_id: int) -> None:
        if identity:
            self.by_identity[identity] = sender_id
            self.by_identity.move_to_end(identity)
            if len(self.by_identity) > self.config.learner.max_senders:
                self.by_identity.popitem(last=False)

    def _check(self, hello: dict, obs_spec: spaces.Spec, action_spec: spaces.Spec) -> str:
        """The role of a hello that fits the learner; HelloRefused names what does not."""
        role = hello.get("role")
        if role not in ("actor", "server", "eval"):
            raise HelloRefused(f"unknown role {wire.show(role)} (expected actor, server or eval)")
        if role == "eval" and not self.config.run.eval_actor:
            raise HelloRefused("an evaluation actor, but this learner's config has run.eval_actor false (its returns would not be used)")
        if hello.get("algo") != self.config.algo.name:
            raise HelloRefused(f"algorithm {wire.show(hello.get('algo'))} differs from the learner's {self.config.algo.name!r}")
        if obs_spec != self.obs_spec or action_spec != self.action_spec:
            raise HelloRefused(f"specs differ from the learner's: obs {wire.show(obs_spec.to_json())} vs {self.obs_spec.to_json()}, "
                               f"action {wire.show(action_spec.to_json())} vs {self.action_spec.to_json()}")
        num_envs = hello.get("num_envs")
        if role != "eval":
            self._check_chunks(hello.get("unroll_length"), num_envs)
        if hello.get("model_hash") != self.model_hash:
            raise HelloRefused(f"model config differs from the learner's ({self._model_diffs(hello.get('model'))}): "
                               "start actors with the learner's config")
        return role

    def _check_chunks(self, T, K) -> None:
        want_T = self.config.actor.unroll_length
        if T != want_T:
            raise HelloRefused(f"unroll_length {wire.show(T)} differs from the learner's actor.unroll_length {want_T}")
        if not isinstance(K, int) or isinstance(K, bool) or not 1 <= K <= MAX_NUM_ENVS:
            raise HelloRefused(f"num_envs {wire.show(K)} must be an int in [1, {MAX_NUM_ENVS}]")
        B = self.config.learner.batch_size
        if self.config.algo.batch_source == "stream" and B % K != 0:
            # (Only a stream learner fills batches of columns: a replay samples them, and the
            # other sources take whole rollouts or gradients.)
            raise HelloRefused(f"num_envs {K} must divide the learner's batch_size {B}")

    def _model_diffs(self, theirs) -> str:
        ours = self.config.model_shaping()["model"]
        if not isinstance(theirs, dict):
            return "model_hash mismatch"
        keys = [k for k in sorted(set(ours) | {k for k in theirs if isinstance(k, str)}) if theirs.get(k) != ours.get(k)]
        diffs = [f"model.{wire.short(k, 40)}: {wire.show(theirs.get(k))} here, {ours.get(k)!r} on the learner" for k in keys[:4]]
        return "; ".join(diffs) or "model_hash mismatch"
