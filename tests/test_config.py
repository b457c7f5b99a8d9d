"""Config: typed sections, unknown keys and bad values named with the file."""
from __future__ import annotations

import os
from pathlib import Path
import re

import pytest

from zrl import algorithms
from zrl.algorithms.impala import ImpalaConfig
from zrl.config import Config, ConfigError, config_from_dict, load_config
from helpers import DEFAULT_CONFIG


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
    for name in algorithms.names():
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


def _other_paths() -> list[str]:
    """PYTHONPATH's entries other than the checkout (where the dependencies may come from)."""
    from helpers import ROOT

    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT.resolve()]


@pytest.mark.timeout(120)
def test_an_installed_package_ships_the_configs_and_finds_its_default(tmp_path):
    """`pip install .` (not editable) builds through setup.py's build_py: the package it
    installs must hold configs/*.yaml, and `zrl run` without --config must find the
    default from any directory."""
    import subprocess
    import sys

    from helpers import ROOT

    lib = tmp_path / "lib"
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(lib)], cwd=ROOT, check=True, capture_output=True, timeout=100)
    shipped = sorted(p.name for p in (lib / "zrl" / "configs").glob("*.yaml"))
    assert shipped == sorted(p.name for p in (ROOT / "configs").glob("*.yaml")) and "cartpole_impala.yaml" in shipped
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run([sys.executable, "-c", "from zrl.config import default_config_path, load_config as l; p = default_config_path(); l(p); print(p)"],
                         cwd=elsewhere, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(lib), *_other_paths()])}, check=True,
                         capture_output=True, text=True, timeout=60)
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


def test_run_seed_must_keep_the_env_seeds_within_int32():
    # actors seed their envs with seed * 10_000 + ...: gymnasium refuses negative seeds, ale_py int32 overflows
    assert load_config(DEFAULT_CONFIG, ["run.seed=0"]).run.seed == 0
    assert load_config(DEFAULT_CONFIG, ["run.seed=214747"]).run.seed == 214747  # 214747 * 10_000 + 10_000 < 2**31
    for bad in ("-1", "214748", "10000000"):
        with pytest.raises(ConfigError, match=r"^override 'run.seed=.*': run\.seed: must be in \[0, 214747\] .*seed \* 10_000.*2\*\*31"):
            load_config(DEFAULT_CONFIG, [f"run.seed={bad}"])


def test_cnn_channels_must_not_be_empty():
    with pytest.raises(ConfigError, match=r"model\.cnn_channels: must list at least one"):
        load_config(DEFAULT_CONFIG, ["model.network=impala_deep", "model.cnn_channels=[]"])
    assert load_config(DEFAULT_CONFIG, ["model.cnn_channels=[8]"]).model.cnn_channels == (8,)


def test_atari_frames_too_small_for_the_cnn_fail_when_the_config_loads():
    pong = DEFAULT_CONFIG.parent / "pong_impala.yaml"
    with pytest.raises(ConfigError, match=r"^override 'env.screen_size=19': env\.screen_size: must be >= 20 for model\.network impala_shallow"):
        load_config(pong, ["env.screen_size=19"])
    assert load_config(pong, ["env.screen_size=20"]).env.screen_size == 20
    assert load_config(pong, ["env.screen_size=8", "model.network=impala_deep"]).env.screen_size == 8  # padded: any size
    # not an Atari id: env.screen_size sizes nothing, so it is not held against the CNN
    assert load_config(DEFAULT_CONFIG, ["env.screen_size=8", "model.network=impala_shallow"]).env.screen_size == 8


def test_images_too_small_for_the_cnn_are_a_value_error_naming_the_keys():
    """The dry run over the input shape (the agent server's image spaces, say) fails as a
    ValueError, which actors report as a config error (exit 2), not torch's RuntimeError."""
    from zrl import spaces
    from zrl.config import ModelConfig
    from zrl.models import build_actor_critic

    for size in (8, 19):
        obs = spaces.BoxSpec((4, size, size), "uint8", 0.0, 255.0)
        with pytest.raises(ValueError, match=rf"model\.network impala_shallow cannot take {size}x{size} images.*env\.screen_size"):
            build_actor_critic(ModelConfig(network="impala_shallow"), obs, spaces.DiscreteSpec(6))
    build_actor_critic(ModelConfig(network="impala_shallow"), spaces.BoxSpec((4, 20, 20), "uint8", 0.0, 255.0), spaces.DiscreteSpec(6))


def test_optimizer_hyper_parameters_are_checked_as_torch_would():
    for override, why in (
        ("learner.adam_betas=[1.0, 0.999]", r"learner\.adam_betas: each beta must be in \[0, 1\); got 1.0 at index 0"),
        ("learner.adam_betas=[0.9, -0.1]", r"learner\.adam_betas: each beta must be in \[0, 1\); got -0.1 at index 1"),
        ("learner.adam_eps=0", r"learner\.adam_eps: must be > 0"),
        ("learner.adam_eps=-1e-8", r"learner\.adam_eps: must be > 0"),
        ("learner.rmsprop_alpha=-0.5", r"learner\.rmsprop_alpha: must be in \[0, 1\]"),
        ("learner.rmsprop_eps=0", r"learner\.rmsprop_eps: must be > 0"),
        ("learner.rmsprop_momentum=-1", r"learner\.rmsprop_momentum: must be >= 0"),
    ):
        with pytest.raises(ConfigError, match=rf"^override '{re.escape(override)}': {why}"):
            load_config(DEFAULT_CONFIG, [override])
    ok = load_config(DEFAULT_CONFIG, ["learner.adam_betas=[0, 0.99]", "learner.rmsprop_alpha=0", "learner.rmsprop_momentum=0.9"])
    assert ok.learner.adam_betas == (0.0, 0.99) and ok.learner.rmsprop_momentum == 0.9


def test_integer_keys_take_exponent_notation_as_float_keys_do():
    # YAML 1.1 reads 1e7 (no dot) as a string
    cfg = load_config(DEFAULT_CONFIG, ["run.max_env_steps=1e7", "learner.lr_decay_env_steps=5E6", "run.num_actors=1.5e1", "run.seed=1e2"])
    assert (cfg.run.max_env_steps, cfg.learner.lr_decay_env_steps, cfg.run.num_actors, cfg.run.seed) == (10_000_000, 5_000_000, 15, 100)
    assert type(cfg.run.max_env_steps) is int
    assert load_config(DEFAULT_CONFIG, ["run.max_env_steps=1e30"]).run.max_env_steps == 10**30  # exact, not float's 1e30
    for bad in ("2.5", "2.5e0", "1e-1", "1e999", "ten", ".nan", "1e7x"):
        with pytest.raises(ConfigError, match=r"run\.max_env_steps: expected an integer"):
            load_config(DEFAULT_CONFIG, [f"run.max_env_steps={bad}"])


def test_an_override_fills_a_section_left_empty_in_the_file(tmp_path):
    p = write(tmp_path, "env:\n  id: CartPole-v1\nrun:\n  # num_actors: 4\n")
    assert load_config(p).run.num_actors == 2
    assert load_config(p, ["run.num_actors=1"]).run.num_actors == 1


def test_an_lstm_core_with_a_q_network_fails_when_the_config_loads():
    apex = DEFAULT_CONFIG.parent / "cartpole_apex.yaml"
    with pytest.raises(ConfigError, match=r"^override 'model.lstm_size=16': model\.lstm_size: must be 0 with algo\.name apex_dqn"):
        load_config(apex, ["model.lstm_size=16"])
    assert load_config(apex, ["model.lstm_size=0"]).model.lstm_size == 0
    assert load_config(DEFAULT_CONFIG, ["model.lstm_size=16"]).model.lstm_size == 16  # impala has one


def test_an_unknown_section_names_the_file_and_the_section_never_an_override(tmp_path):
    p = write(tmp_path, "learnr:\n  batch_size: 3\nrun:\n  seed: 2\n")
    for overrides in ([], ["run.max_seconds=5"], ["run.seed=3", "learner.batch_size=8"]):
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(p))}: unknown section 'learnr' \(known sections: actor, algo, env, learner"):
            load_config(p, overrides)
    with pytest.raises(ConfigError, match=r"^override 'lerner.batch_size=3': unknown section 'lerner' \(known sections: "):
        load_config(DEFAULT_CONFIG, ["run.seed=3", "lerner.batch_size=3"])
    with pytest.raises(ConfigError, match=r"unknown sections 'a', 'b'"):
        load_config(write(tmp_path, "a: {}\nb: {}\n"))


def test_a_dumped_config_loads_back_equal_for_every_shipped_config(tmp_path):
    from zrl.config import dump_config

    for path in sorted(DEFAULT_CONFIG.parent.glob("*.yaml")):
        cfg = load_config(path, ["run.max_seconds=.inf", "env.kwargs={a: [1, 2]}"])
        (tmp_path / "config.yaml").write_text(dump_config(cfg, "a header\nof two lines"))
        assert load_config(tmp_path / "config.yaml") == cfg, path


def test_config_differences_name_each_key():
    from zrl.config import config_differences

    a = load_config(DEFAULT_CONFIG, ["run.logdir=x"])
    b = load_config(DEFAULT_CONFIG, ["env.id=Acrobot-v1", "model.hidden_sizes=[8]"])
    assert config_differences(a, b, ignore=("run.logdir",)) == [("env.id", "CartPole-v1", "Acrobot-v1"), ("model.hidden_sizes", [64, 64], [8])]
    assert config_differences(a, a) == []
