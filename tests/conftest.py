"""Shared fixtures: a ZeroMQ context, an endpoint, in-process learner/actor runners.

The helpers that tests import (small configs, wait_for, Proc, ...) are in helpers.py."""
from __future__ import annotations

import threading
import uuid

import pytest
import zmq

from helpers import Running


@pytest.fixture
def ctx():
    """A ZeroMQ context; a test that leaves a socket open fails instead of hanging in term()."""
    c = zmq.Context()
    yield c
    leaked = [s for s in list(c._sockets) if not s.closed]
    c.destroy(linger=0)
    assert not leaked, f"the test left {len(leaked)} ZeroMQ socket(s) open"


@pytest.fixture
def endpoint():
    return f"inproc://zrl-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_learner(ctx, endpoint, tmp_path):
    """Starts in-process learners (run() on a thread); stops and closes them after the test."""
    from zrl.learner.learner import Learner

    started = []

    def make(cfg, *, logdir=None, start=True, bind=None, around=None, **kw):
        """around(learner): a context manager that run() executes inside, on the learner's thread."""
        learner = Learner(cfg, bind or endpoint, logdir if logdir is not None else tmp_path / "run", ctx=ctx, console=False, **kw)

        def run():
            if around is None:
                return learner.run()
            with around(learner):
                return learner.run()

        runner = Running(run, "learner") if start else None
        started.append((learner, runner))
        return learner, runner

    yield make
    for learner, runner in started:
        learner.request_stop()
        if runner is not None:
            runner.thread.join(30)
        learner.close()


@pytest.fixture
def make_actor(ctx, endpoint):
    """Starts in-process actors on threads; stops them after the test."""
    from zrl.actors.actor import Actor

    started = []

    def make(cfg, *, index=0, num_actors=1, learner=None, **kw):
        stop = threading.Event()
        actor = Actor(cfg, learner or endpoint, index, num_actors, ctx=ctx, stop=stop, console=False, **kw)
        runner = Running(actor.run, f"actor-{index}")
        started.append((actor, runner))
        return actor, runner

    yield make
    for actor, runner in started:
        actor.stop.set()
    for actor, runner in started:
        runner.thread.join(30)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> the logdir of a small saved policy (tests/saved_policies.py POLICIES), each
    made once per module: for the tests of zrl.load and zrl export."""
    from saved_policies import save_policy

    made = {}

    def get(name):
        if name not in made:
            made[name] = save_policy(tmp_path_factory.mktemp(name), name)
        return made[name]

    return get
