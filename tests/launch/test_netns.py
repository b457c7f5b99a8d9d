"""Several hosts: learner and two actors in separate network namespaces joined by veth pairs.

One actor's link is cut for a few seconds; training continues on the other
actor's data and the cut actor rejoins. Needs root and `ip netns` (skipped
with the reason otherwise).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid

import pytest

from helpers import ROOT, Proc, wait_for


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _netns_unavailable() -> str | None:
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"zrl-probe-{uuid.uuid4().hex[:6]}"
    p = _ip("netns", "add", name, check=False)
    if p.returncode != 0:
        return f"ip netns add is not allowed here: {p.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


REASON = _netns_unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture
def hosts():
    """A learner namespace linked to two actor namespaces: {name: (ns, address the learner is reached at)}."""
    tag = uuid.uuid4().hex[:5]
    learner_ns = f"zrl-l-{tag}"
    made = [learner_ns]
    _ip("netns", "add", learner_ns)
    _ip("-n", learner_ns, "link", "set", "lo", "up")
    out = {}
    try:
        for i in (1, 2):
            ns = f"zrl-a{i}-{tag}"
            _ip("netns", "add", ns)
            made.append(ns)
            l_if, a_if = f"vl{i}{tag}", f"va{i}{tag}"
            _ip("link", "add", l_if, "type", "veth", "peer", "name", a_if)
            _ip("link", "set", l_if, "netns", learner_ns)
            _ip("link", "set", a_if, "netns", ns)
            _ip("-n", learner_ns, "addr", "add", f"10.77.{i}.1/24", "dev", l_if)
            _ip("-n", ns, "addr", "add", f"10.77.{i}.2/24", "dev", a_if)
            _ip("-n", learner_ns, "link", "set", l_if, "up")
            _ip("-n", ns, "link", "set", a_if, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            out[f"actor{i}"] = (ns, f"10.77.{i}.1", a_if)
        out["learner"] = (learner_ns, None, None)
        yield out
    finally:
        for ns in made:
            _ip("netns", "del", ns, check=False)


def in_ns(ns: str, args: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, sys.executable, "-m", "zrl", *args]


class NsProc(Proc):
    def __init__(self, argv):  # argv already starts with ip netns exec ...
        import threading

        self.p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_training_survives_a_cut_link_and_the_actor_rejoins(tmp_path, hosts):
    learner_ns = hosts["learner"][0]
    ready = tmp_path / "ready.json"
    common = ["-o", "actor.learner_timeout_s=3", "-o", "learner.actor_timeout_s=1.5", "-o", "learner.log_interval_s=0.5"]
    learner = NsProc(in_ns(learner_ns, ["learner", "--bind", "tcp://0.0.0.0:*", "--logdir", str(tmp_path / "run"),
                                        "--ready-file", str(ready), "--max-seconds", "150", "--stop-at-return", "1e9", *common]))
    procs = [learner]
    try:
        wait_for(ready.exists, 60, "the learner to bind")
        port = json.loads(ready.read_text())["control"].rsplit(":", 1)[1]
        for i in (1, 2):
            ns, addr, _ = hosts[f"actor{i}"]
            procs.append(NsProc(in_ns(ns, ["actor", "--learner", f"tcp://{addr}:{port}", "--index", str(i - 1), "--num-actors", "2", *common])))

        def actors_connected():
            m = [re.search(r"actors (\d)", l) for l in learner.lines if "updates" in l]
            return int(m[-1].group(1)) if m and m[-1] else 0

        def updates():
            m = [re.search(r"updates ([\d,]+)", l) for l in learner.lines]
            m = [x for x in m if x]
            return int(m[-1].group(1).replace(",", "")) if m else 0

        wait_for(lambda: actors_connected() == 2, 90, lambda: f"both actors to send data: {learner.output[-1500:]}")
        ns1, _, if1 = hosts["actor1"]
        _ip("-n", ns1, "link", "set", if1, "down")  # cut actor 1 off
        try:
            wait_for(lambda: actors_connected() == 1, 30, "the learner to notice the silent actor")
            before = updates()
            wait_for(lambda: updates() >= before + 20, 30, "training to continue on actor 2's data alone")
        finally:
            _ip("-n", ns1, "link", "set", if1, "up")
        wait_for(lambda: actors_connected() == 2, 60,
                 lambda: f"actor 1 to rejoin; actor 1 said:\n{procs[1].output[-1500:]}\nthe learner:\n{learner.output[-800:]}")
        os.killpg(learner.p.pid, signal.SIGINT)
        assert learner.wait(30) == 130, learner.output[-2000:]
    finally:
        for p in procs:
            p.kill_tree()
