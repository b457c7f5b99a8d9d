"""Config: typed sections, unknown keys and bad values named with the file."""
from __future__ import annotations

import os
import re

import pytest

from zrl.config import ALGO_CONFIGS, Config, ConfigError, ImpalaConfig, config_from_dict, load_config
from conftest import DEFAULT_CONFIG


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_default_config_loads_and_is_impala_on_cartpole():
    cfg = load_config(DEFAULT_CONFIG)
    assert cfg.env.id == "CartPole-v1"
    assert isinstance(cfg.algo, ImpalaConfig)
    assert cfg.run.num_actors == 2
    assert cfg.learner.batch_size % cfg.actor.num_envs == 0


def test_unknown_key_names_key_and_file(tmp_path):
    p = write(tmp_path, "learner:\n  learning_rat: 0.1\n")
    with pytest.raises(ConfigError, match=r"c\.yaml.*learner\.learning_rat"):
        load_config(p)


def test_unknown_section_names_it(tmp_path):
    with pytest.raises(ConfigError, match=r"c\.yaml.*learnr"):
        load_config(write(tmp_path, "learnr: {}\n"))


def test_wrong_type_names_key(tmp_path):
    with pytest.raises(ConfigError, match=r"c\.yaml.*actor\.num_envs.*integer"):
        load_config(write(tmp_path, "actor:\n  num_envs: many\n"))
    with pytest.raises(ConfigError, match=r"model\.shared_torso"):
        load_config(write(tmp_path, "model:\n  shared_torso: 3\n"))


def test_invariants_give_the_reason(tmp_path):
    with pytest.raises(ConfigError, match=r"algo\.discount.*\[0, 1\]"):
        load_config(write(tmp_path, "algo:\n  name: impala\n  discount: 1.5\n"))
    with pytest.raises(ConfigError, match="multiple of actor.num_envs"):
        load_config(write(tmp_path, "actor:\n  num_envs: 3\nlearner:\n  batch_size: 64\n"))
    with pytest.raises(ConfigError, match=r"env\.thread_nice.*\[0, 19\]"):
        load_config(write(tmp_path, "env:\n  id: ALE/Pong-v5\n  thread_nice: 20\n"))


def test_a_section_that_is_not_a_mapping_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"c\.yaml.*section 'algo' must be a mapping"):
        load_config(write(tmp_path, "algo: impala\n"))
    with pytest.raises(ConfigError, match=r"c\.yaml.*section 'env' must be a mapping"):
        load_config(write(tmp_path, "env: [CartPole-v1]\n"))


def test_numbers_must_be_finite_except_where_inf_means_no_limit(tmp_path):
    for key in ("actor.learner_timeout_s", "actor.stats_interval_s", "learner.actor_timeout_s", "learner.learning_rate"):
        with pytest.raises(ConfigError, match=rf"{key}: must be a finite number"):
            load_config(DEFAULT_CONFIG, [f"{key}=.inf"])
    with pytest.raises(ConfigError, match=r"c\.yaml.*actor\.learner_timeout_s: must be a finite number"):
        load_config(write(tmp_path, "actor:\n  learner_timeout_s: .inf\n"))
    with pytest.raises(ConfigError, match=r"algo\.discount: must be a finite number"):
        load_config(DEFAULT_CONFIG, ["algo.discount=.nan"])
    with pytest.raises(ConfigError, match=r"algo\.clip_rho_threshold: must be a finite number"):
        load_config(DEFAULT_CONFIG, ["algo.clip_rho_threshold=.nan"])
    cfg = load_config(DEFAULT_CONFIG, ["algo.clip_rho_threshold=.inf", "run.max_seconds=.inf", "run.stop_at_return=.inf"])
    assert cfg.algo.clip_rho_threshold == cfg.run.max_seconds == cfg.run.stop_at_return == float("inf")


def test_unknown_algorithm_lists_known_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"algo\.name.*'ppo2'.*impala"):
        load_config(write(tmp_path, "algo:\n  name: ppo2\n"))


def test_overrides_apply_and_are_checked(tmp_path):
    p = write(tmp_path, "learner:\n  learning_rate: 0.1\n")
    cfg = load_config(p, ["learner.learning_rate=3e-4", "model.hidden_sizes=[32, 16]", "run.stop_at_return=null"])
    assert cfg.learner.learning_rate == pytest.approx(3e-4)
    assert cfg.model.hidden_sizes == (32, 16)
    assert cfg.run.stop_at_return is None
    with pytest.raises(ConfigError, match=r"learner\.nope"):
        load_config(p, ["learner.nope=1"])
    with pytest.raises(ConfigError, match="section.key"):
        load_config(p, ["learning_rate=1"])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "learner: [unclosed\n"))
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "- a list\n"))


def test_round_trip_through_dict():
    cfg = load_config(DEFAULT_CONFIG)
    again = config_from_dict(cfg.to_dict())
    assert again == cfg
    assert again.model_hash() == cfg.model_hash()


def test_model_hash_tracks_what_shapes_the_model():
    cfg = Config()
    obs = {"type": "box", "shape": [4], "dtype": "float32", "low": None, "high": None}
    act = {"type": "discrete", "n": 2}
    base = cfg.model_hash(obs, act)
    assert cfg.replace(learner=cfg.learner.__class__(learning_rate=0.5)).model_hash(obs, act) == base
    wider = config_from_dict({**cfg.to_dict(), "model": {**cfg.to_dict()["model"], "hidden_sizes": [128, 128]}})
    assert wider.model_hash(obs, act) != base
    assert cfg.model_hash(obs, {"type": "discrete", "n": 3}) != base


def test_every_registered_algorithm_has_a_loadable_module():
    from zrl.learner import algorithms

    for name in ALGO_CONFIGS:
        assert algorithms.get(name).name == name


def test_an_override_that_breaks_the_config_is_named_rather_than_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"^override 'learner.learning_rat=1e-3': unknown key learner.learning_rat "):
        load_config(DEFAULT_CONFIG, ["learner.learning_rat=1e-3"])
    # the last override of a key is the one that counts, so it is the one named
    with pytest.raises(ConfigError, match=r"^override 'learner.learning_rate=-1': learner.learning_rate: must be > 0$"):
        load_config(DEFAULT_CONFIG, ["learner.learning_rate=0.1", "learner.learning_rate=-1"])
    with pytest.raises(ConfigError, match=r"^override 'server.bind=tcp://1.2.3.4': server.bind: endpoint"):
        load_config(DEFAULT_CONFIG, ["server.bind=tcp://1.2.3.4"])
    with pytest.raises(ConfigError, match=r"^override 'lerner.batch_size=3': unknown section"):
        load_config(DEFAULT_CONFIG, ["lerner.batch_size=3"])
    # an error about another key, which merely names the override's, is the file's (or that key's override's)
    odd = tmp_path / "odd.yaml"
    odd.write_text("learner:\n  batch_size: 30\nactor:\n  num_envs: 4\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(odd))}: learner.batch_size \(30\) must be a multiple"):
        load_config(odd, ["actor.env_groups=1"])
    with pytest.raises(ConfigError, match=r"^override 'learner.batch_size=7': learner.batch_size \(7\) must be a multiple"):
        load_config(DEFAULT_CONFIG, ["learner.batch_size=7", "actor.num_envs=4"])
    # groups that do not divide the envs: an error about env_groups (the file's 3), naming both numbers
    pong = DEFAULT_CONFIG.parent / "pong_impala.yaml"
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(pong))}: actor.env_groups: must be >= 1 and divide actor.num_envs \(16\); got 3$"):
        load_config(pong, ["actor.num_envs=16"])
    assert load_config(DEFAULT_CONFIG, ["learner.trajectory_bind=''"]).learner.trajectory_bind == ""  # empty: derived, as before
    bad = tmp_path / "bad.yaml"
    bad.write_text("run:\n  max_seconds: -1\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(bad))}: run.max_seconds: must be > 0$"):  # the file's own value
        load_config(bad, ["learner.learning_rate=0.1"])


@pytest.mark.timeout(120)
def test_an_installed_package_ships_the_configs_and_finds_its_default(tmp_path):
    """`pip install .` (not editable) builds through setup.py's build_py: the package it
    installs must hold configs/*.yaml, and `zrl run` without --config must find the
    default from any directory."""
    import subprocess
    import sys

    from conftest import ROOT

    lib = tmp_path / "lib"
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(lib)], cwd=ROOT, check=True, capture_output=True, timeout=100)
    shipped = sorted(p.name for p in (lib / "zrl" / "configs").glob("*.yaml"))
    assert shipped == sorted(p.name for p in (ROOT / "configs").glob("*.yaml")) and "cartpole_impala.yaml" in shipped
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run([sys.executable, "-c", "from zrl.config import default_config_path, load_config as l; p = default_config_path(); l(p); print(p)"],
                         cwd=elsewhere, env={**os.environ, "PYTHONPATH": str(lib)}, check=True, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == str(lib / "zrl" / "configs" / "cartpole_impala.yaml")


def test_learner_device_must_be_one_of_the_accepted_forms():
    for good in ("auto", "cpu", "cuda", "cuda:0", "cuda:12"):
        assert load_config(DEFAULT_CONFIG, [f"learner.device={good}"]).learner.device == good
    for bad in ("cuda:x", "cudafoo", "cuda:", "cuda:0:1", "cuda:-1", "CPU", "cpu:0", "", " cuda"):
        with pytest.raises(ConfigError, match=r"learner\.device: must be auto, cpu or cuda\[:N\]"):
            load_config(DEFAULT_CONFIG, [f"learner.device='{bad}'"])


def test_server_spaces_are_parsed_when_the_config_is_loaded():
    ok = load_config(DEFAULT_CONFIG, ["server.observation_space={type: box, shape: [4], dtype: uint8}", "server.action_space={type: discrete, n: 3}"])
    assert ok.server.action_space == {"type": "discrete", "n": 3}
    assert load_config(DEFAULT_CONFIG, ["server.action_space={type: discrete, n: 2}"]).server.observation_space is None  # env.id's
    for override, why in (
        ("server.observation_space={type: box, shape: [0]}", r"server\.observation_space: box dim"),
        ("server.observation_space={shape: [4]}", r"server\.observation_space: a space spec must be a mapping with a 'type'"),
        ("server.observation_space={type: box, shape: [4], dtype: float64}", r"server\.observation_space: clients send float32 or uint8"),
        ("server.action_space={type: discreet, n: 2}", r"server\.action_space: unknown space type 'discreet'"),
        ("server.action_space={type: discrete, n: 0}", r"server\.action_space: discrete n"),
        ("server.action_space={type: discrete, n: 2, low: 0}", r"server\.action_space: unknown keys"),
    ):
        with pytest.raises(ConfigError, match=why):
            load_config(DEFAULT_CONFIG, [override])
