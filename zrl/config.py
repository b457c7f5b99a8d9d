"""One typed configuration shared by every zrl process.

A config is a YAML file with one mapping per section (`env`, `model`, `algo`,
`actor`, `learner`, `run`, `server`, `security`); each section is a frozen
dataclass (zrl.config_sections) with a docstring on every field (docs/CONFIG.md
is generated from them). `algo.name` selects the algorithm, and the remaining `algo` keys
are that algorithm's hyper-parameters, a dataclass of its own found through
the registry in zrl.algorithms. Unknown keys and wrong types are errors that
name the key and the file; invariants are checked in `__post_init__` with the
reason. `-o section.key=value` overrides (values parsed as YAML) are applied
before validation.

Everything here is import-light (no torch), so the CLI can validate a config
before starting any process.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from zrl import algorithms, env_ids
from zrl.config_sections import (
    ActorConfig,
    EnvConfig,
    LearnerConfig,
    ModelConfig,
    RunConfig,
    SecurityConfig,
    ServerConfig,
)
from zrl.typed_config import ConfigError, build_section, check

__all__ = [
    "ConfigError",
    "Config",
    "EnvConfig",
    "ModelConfig",
    "ActorConfig",
    "LearnerConfig",
    "RunConfig",
    "ServerConfig",
    "SecurityConfig",
    "SECTIONS",
    "load_config",
    "config_from_dict",
    "config_differences",
    "dump_config",
    "default_config_path",
    "resolve_config_path",
    "shipped_config_names",
]

# The smallest frames (env.screen_size) each CNN takes; impala_deep's padded convolutions and
# max-pools take any size. zrl.models.cnn's dry run catches other image shapes (the agent server's).
CNN_MIN_SCREEN_SIZE: dict[str, int] = {"impala_shallow": 20}
CNN_MIN_SCREEN_WHY: dict[str, str] = {"impala_shallow": "an 8x8 convolution of stride 4, then a 4x4 one of stride 2"}


SECTIONS: dict[str, type] = {
    "env": EnvConfig,
    "model": ModelConfig,
    "actor": ActorConfig,
    "learner": LearnerConfig,
    "run": RunConfig,
    "server": ServerConfig,
    "security": SecurityConfig,
}


@dataclass(frozen=True)
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algo: Any = field(default_factory=lambda: algorithms.config_class("impala")())
    actor: ActorConfig = field(default_factory=ActorConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    run: RunConfig = field(default_factory=RunConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    source: str = field(default="<defaults>", compare=False)
    """Where this config came from (for messages)."""

    def __post_init__(self):
        width = self.actor.num_envs // self.actor.env_groups  # the columns one chunk fills
        if self.algo.batch_source == "version":
            self._check_synchronous()
        share = self.learner.batch_size // self.learner.num_learners  # (one learner's, of a group)
        if self.algo.batch_source == "stream" and share % width != 0:
            raise ConfigError(
                f"learner.batch_size ({self.learner.batch_size}) must be a multiple of "
                f"actor.num_envs / actor.env_groups ({width})"
                + (f" times learner.num_learners ({self.learner.num_learners})" if self.learner.num_learners > 1 else "")
            )
        if self.learner.num_learners > 1:
            self._check_group()
        check(not self.model.normalize_obs or getattr(self.algo, "normalizes_obs", False), "model.normalize_obs",
              f"not with algo.name {self.algo.name} (its networks take observations as they come)")
        check(self.model.lstm_size == 0 or getattr(self.algo, "lstm_core", True), "model.lstm_size",
               f"must be 0 with algo.name {self.algo.name} (its network has no LSTM core); got {self.model.lstm_size}")
        least = CNN_MIN_SCREEN_SIZE.get(self.model.network, 1)
        if self.env.screen_size < least and env_ids.is_atari(self.env.id):  # screen_size only sizes Atari frames
            raise ConfigError(
                f"env.screen_size: must be >= {least} for model.network {self.model.network} "
                f"({CNN_MIN_SCREEN_WHY[self.model.network]}); got {self.env.screen_size}"
            )


    def _check_group(self) -> None:
        """Several learners average their gradients of one loss over their shares of a batch:
        an algorithm whose update is such a step on fresh chunks, with nothing else learned.
        (algo.normalize_advantages normalises over each share, as DDP implementations of
        PPO do: the step is then close to, not the same as, one learner's on the batch.)"""
        check(self.algo.name in ("impala", "appo"), "learner.num_learners",
              f"must be 1 with algo.name {self.algo.name}: several learners train IMPALA and APPO only (their update "
              "is one gradient step on a batch of fresh chunks)")
        check(not self.model.normalize_obs, "learner.num_learners",
              "must be 1 with model.normalize_obs (each learner's statistics would drift from the others')")

    def _check_synchronous(self) -> None:
        """A synchronous learner (batch_source "version") publishes every update, and each of
        its actors sends one chunk per version, then waits for the next."""
        name = self.algo.name
        check(self.learner.publish_interval == 1, "learner.publish_interval",
              f"must be 1 with algo.name {name} (its actors wait for each new version); got {self.learner.publish_interval}")
        check(self.actor.env_groups == 1, "actor.env_groups",
              f"must be 1 with algo.name {name} (an actor sends one chunk per policy version); got {self.actor.env_groups}")
    def to_dict(self) -> dict[str, Any]:
        d = {name: _to_plain(dataclasses.asdict(getattr(self, name))) for name in ("env", "model", "algo", "actor", "learner", "run", "server", "security")}
        return d

    def model_shaping(self, obs_spec: dict | None = None, action_spec: dict | None = None) -> dict[str, Any]:
        """What shapes the model's parameters (a checkpoint is only loadable under the same)."""
        return {
            "model": _to_plain(dataclasses.asdict(self.model)),
            "algo": self.algo.name,
            "obs": obs_spec,
            "action": action_spec,
        }

    def model_hash(self, obs_spec: dict | None = None, action_spec: dict | None = None) -> str:
        shaping = self.model_shaping(obs_spec, action_spec)
        return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]

    def replace(self, **sections: Any) -> "Config":
        return dataclasses.replace(self, **sections)


def dump_config(cfg: Config, header: str = "") -> str:
    """The config as YAML that load_config reads back to an equal Config (every key, resolved)."""
    lines = "".join(f"# {line}\n" for line in header.splitlines())
    return lines + yaml.dump(cfg.to_dict(), Dumper=_ConfigDumper, sort_keys=False, default_flow_style=False)


class _ConfigDumper(yaml.SafeDumper):
    """Sections and their keys one a line; a list value on its line ([64, 64])."""


_ConfigDumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def config_differences(a: Config, b: Config, ignore: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """(section.key, a's value, b's value) for each key whose values differ, but those in `ignore`."""
    da, db = a.to_dict(), b.to_dict()
    out = []
    for section in da:
        for key in sorted(set(da[section]) | set(db[section])):
            name = f"{section}.{key}"
            va, vb = da[section].get(key), db[section].get(key)
            if va != vb and name not in ignore:
                out.append((name, va, vb))
    return out


def _to_plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _to_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_plain(v) for v in x]
    return x


DEFAULT_CONFIG_NAME = "cartpole_impala"


def shipped_config_dir() -> Path:
    """Where the shipped configs are: configs/ next to the package (a source checkout, an
    editable install), else the copy an installed package ships (zrl/configs/), else
    configs/ in the working directory."""
    package = Path(__file__).resolve().parent
    for here in (package.parent / "configs", package / "configs"):
        if (here / f"{DEFAULT_CONFIG_NAME}.yaml").exists():  # (not some other package's configs/)
            return here
    return Path("configs")


def shipped_config_names() -> list[str]:
    return sorted(p.stem for p in shipped_config_dir().glob("*.yaml"))


def default_config_path() -> Path:
    return shipped_config_dir() / f"{DEFAULT_CONFIG_NAME}.yaml"


def resolve_config_path(config: str | Path | None) -> Path:
    """The file `--config` names: a path that exists, else the shipped config of that name
    ("pong_impala", "pong_impala.yaml", or "configs/pong_impala.yaml" outside the repo);
    ConfigError listing the shipped names when neither is found."""
    if config is None:
        return default_config_path()
    path = Path(config)
    if path.exists() or path.parent not in (Path("."), Path("configs")):
        return path  # (a path elsewhere that does not exist: load_config says so)
    name = path.name[: -len(".yaml")] if path.name.endswith(".yaml") else path.name
    shipped = shipped_config_dir() / f"{name}.yaml"
    if shipped.exists():
        return shipped
    raise ConfigError(f"no config file {config} here, and no shipped config named {name!r} "
                      f"(shipped: {', '.join(shipped_config_names())})")


# ---------------------------------------------------------------------------
# Loading: YAML -> raw dict -> overrides -> typed dataclasses


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Reads a YAML config and applies `section.key=value` overrides. `path` is a file or a
    shipped config's name (resolve_config_path; default: cartpole_impala)."""
    p = resolve_config_path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {p}: {e.strerror or e}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections, got {type(raw).__name__}")
    _check_sections(raw, str(p))  # the file's own, before any override (which apply_overrides checks)
    raw = apply_overrides(raw, overrides, str(p))
    try:
        return config_from_dict(raw, source=str(p))
    except ConfigError as e:
        raise _blame_override(e, str(p), overrides) from None


def _blame_override(e: ConfigError, source: str, overrides) -> ConfigError:
    """The error attributed to the override that set the key it names (the last one, as it
    is the one that counts), rather than to the file."""
    msg = str(e)
    detail = msg[len(source) + 2 :] if msg.startswith(f"{source}: ") else msg
    for item in reversed(list(overrides)):
        key = item.split("=", 1)[0].strip()
        # only an error about this key ("KEY: why", "KEY (value) ...", "unknown key KEY ..."),
        # not one that merely mentions it beside the key at fault
        if re.match(rf"(unknown key )?{re.escape(key)}(:| \(| |$)", detail):
            return ConfigError(f"override {item!r}: {detail}")
    return e


def _known_sections() -> str:
    return ", ".join(sorted([*SECTIONS, "algo"]))


def _check_sections(raw: dict, where: str) -> None:
    """ConfigError naming `where` (a file, an override) and each section zrl does not know."""
    unknown = sorted(str(k) for k in set(raw) - set(SECTIONS) - {"algo"})
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        raise ConfigError(f"{where}: unknown section{'s' if len(unknown) > 1 else ''} {names} (known sections: {_known_sections()})")


def apply_overrides(raw: dict, overrides: list[str] | tuple[str, ...], source: str) -> dict:
    raw = json.loads(json.dumps(raw))  # deep copy of plain data
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected section.key=value")
        key, value_text = item.split("=", 1)
        parts = key.strip().split(".")
        if len(parts) != 2 or not all(parts):
            raise ConfigError(f"override {item!r}: the key must be section.key (e.g. learner.learning_rate)")
        section, name = parts
        _check_sections({section: None}, f"override {item!r}")
        try:
            value = yaml.safe_load(value_text)
        except yaml.YAMLError:
            value = value_text
        sec = raw.setdefault(section, {})
        if sec is None:  # an empty section in the file (its keys commented out), as config_from_dict takes it
            sec = raw[section] = {}
        if not isinstance(sec, dict):
            raise ConfigError(f"{source}: section {section!r} must be a mapping")
        sec[name] = value
    return raw


def config_from_dict(raw: dict, source: str = "<dict>") -> Config:
    """Builds a Config from plain data (a parsed YAML file or Config.to_dict())."""
    _check_sections(raw, source)
    built: dict[str, Any] = {}
    try:
        for name, cls in SECTIONS.items():
            built[name] = build_section(cls, raw.get(name) or {}, name, source)
        algo_raw = raw.get("algo") or {}
        if not isinstance(algo_raw, dict):
            raise ConfigError(f"{source}: section 'algo' must be a mapping (e.g. algo: {{name: impala}}), got {type(algo_raw).__name__}")
        algo_raw = dict(algo_raw)
        algo_name = algo_raw.get("name", "impala")
        try:
            algo_cls = algorithms.config_class(algo_name)
        except ValueError as e:
            raise ConfigError(f"{source}: algo.name: {e}") from None
        built["algo"] = build_section(algo_cls, algo_raw, "algo", source)
        return Config(**built, source=source)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None
