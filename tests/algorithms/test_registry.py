"""The algorithm registry: packages under zrl/algorithms/ found by name, configs without torch."""
from __future__ import annotations

import subprocess
import sys
import re
import textwrap

import pytest
import torch

import zrl.algorithms as registry
from zrl.algorithms.optim import EnvStepSchedule
from zrl.config import config_from_dict
from helpers import ROOT, small_config

TOY = '''
from dataclasses import dataclass
from typing import ClassVar

from zrl.typed_config import check


@dataclass(frozen=True)
class ToyConfig:
    """A toy algorithm's hyper-parameters."""

    batch_source: ClassVar[str] = "stream"
    name: str = "toy"
    depth: int = 3
    """How deep."""

    def __post_init__(self):
        check(self.depth > 0, "algo.depth", "must be > 0")


CONFIG = ToyConfig
'''


@pytest.fixture
def toy_package(tmp_path, monkeypatch):
    """A package `toy` beside the shipped ones, as an added algorithm would be."""
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "__init__.py").write_text(TOY)
    (tmp_path / "toy" / "algorithm.py").write_text("from zrl.algorithms.impala.algorithm import Impala\n\n"
                                                   "class Toy(Impala):\n    name = 'toy'\n\n\nALGORITHM = Toy\n")
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "_CONFIGS", {})
    yield
    for name in [m for m in sys.modules if m.startswith("zrl.algorithms.toy")]:
        del sys.modules[name]


def test_an_added_package_is_found_by_name_with_nothing_else_changed(toy_package):
    assert "toy" in registry.names() and {"impala", "apex_dqn"} <= set(registry.names())
    cfg = config_from_dict({"algo": {"name": "toy", "depth": 5}})
    assert cfg.algo.depth == 5 and cfg.algo.batch_source == "stream"
    assert registry.get("toy").name == "toy"
    with pytest.raises(ValueError, match=r"algo\.depth: must be > 0"):
        config_from_dict({"algo": {"name": "toy", "depth": 0}}, source="t.yaml")


def test_an_unknown_algorithm_names_the_known_ones():
    known = re.escape(str(registry.names()))
    with pytest.raises(ValueError, match=rf"algo.name: unknown algorithm 'nope' \(known: {known}\)"):
        config_from_dict({"algo": {"name": "nope"}})
    assert {"impala", "apex_dqn", "ppo", "appo", "a3c", "sac"} <= set(registry.names())


def test_validating_a_config_imports_no_torch():
    code = textwrap.dedent("""
        import sys
        from zrl.config import load_config
        load_config("configs/cartpole_apex.yaml")
        assert "torch" not in sys.modules, "torch"
        assert "numpy" not in sys.modules, "numpy"
    """)
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_the_learning_rate_of_a_step_is_set_from_env_steps_before_it():
    # learner.lr_decay_env_steps through torch's LambdaLR: a resumed run's first step, at
    # env steps past the decay, takes the decayed rate, and no torch warning is raised.
    cfg = small_config("learner.lr_decay_env_steps=100", "learner.lr_final_scale=0.1", "learner.learning_rate=0.5")
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([w], lr=cfg.learner.learning_rate)
    schedule = EnvStepSchedule(opt, cfg.learner)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        schedule.advance(50)
        assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * (1 - 0.5 * 0.9))
        schedule.advance(10_000)
        assert opt.param_groups[0]["lr"] == pytest.approx(0.05)


def test_an_algorithms_update_steps_at_the_rate_of_the_env_steps_it_is_given(monkeypatch):
    from zrl import algorithms, spaces

    cfg = small_config("learner.lr_decay_env_steps=100", "learner.lr_final_scale=0.0")
    algo = algorithms.get("impala")(cfg, spaces.BoxSpec((4,), "float32"), spaces.DiscreteSpec(2))
    algo.setup(torch.device("cpu"))
    rates = []

    def loss(model, batch):
        rates.append(algo.optimizer.param_groups[0]["lr"])
        return sum(p.sum() for p in model.parameters()) * 0.0, {}

    monkeypatch.setattr(algo, "loss", loss)
    algo.update({}, env_steps=0)
    algo.update({}, env_steps=50)
    algo.update({}, env_steps=1_000)
    assert rates == pytest.approx([cfg.learner.learning_rate, cfg.learner.learning_rate / 2, 0.0])
