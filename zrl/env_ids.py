"""What an env id names, told without building the env: Atari games and their ROMs.

Light (no gymnasium): config validation asks it whether `env.id` is an Atari
game, and zrl.envs.atari which ROM to load.
"""
from __future__ import annotations

import re

from zrl.typed_config import ConfigError

# Accepted spellings: "ALE/Pong-v5", "PongNoFrameskip-v4", "Pong-v4",
# "PongDeterministic-v4", "Pong", "pong", "ALE/MsPacman-v5", "ms_pacman".
_ID = re.compile(r"^(?:ALE/)?(?P<game>[A-Za-z0-9_]+?)(?:NoFrameskip|Deterministic)?(?:-v\d+)?$")


ATARI_INSTALL = 'Atari games need ale-py: pip install "zrl[atari]"'
# Spellings that only Atari ids use, told apart without ale_py's ROM list.
_ATARI_LOOKING = re.compile(r"^ALE/|NoFrameskip|Deterministic|-ram")


def has_ale_py() -> bool:
    return _rom_ids() is not None


def needs_ale_py(env_id: str) -> bool:
    """Whether env_id looks like an Atari id (ALE/Pong-v5, PongNoFrameskip-v4) and ale_py is not installed."""
    return bool(_ATARI_LOOKING.search(env_id)) and not has_ale_py()


def _rom_ids() -> dict[str, str] | None:
    """Normalised name (lowercase, no underscores) -> ale_py ROM id; None without ale_py."""
    try:
        from ale_py import roms  # lazy: ale_py is optional, and only Atari ids need it
    except ImportError:
        return None
    return {r.replace("_", ""): r for r in roms.get_all_rom_ids()}


def rom_name(env_id: str) -> str:
    """The ale_py ROM id (snake_case, e.g. "ms_pacman") of an Atari env id; ConfigError if none."""
    m = _ID.match(env_id)
    known = _rom_ids()
    if known is None:
        raise ConfigError(f"env.id {env_id!r}: {ATARI_INSTALL}")
    game = known.get(m.group("game").replace("_", "").lower()) if m else None
    if game is None:
        raise ConfigError(
            f"env.id {env_id!r} names no Atari ROM that ale-py has "
            f"(image observations only; -ram ids go through the plain gymnasium backend)"
        )
    return game


def is_atari(env_id: str) -> bool:
    """Whether env_id names an Atari game with image observations (ALE/Pong-v5, PongNoFrameskip-v4, Pong ...)."""
    if "-ram" in env_id:
        return False
    if env_id.startswith("ALE/"):
        return True  # even without ale-py, so that the user hears it is missing
    m = _ID.match(env_id)
    known = _rom_ids()
    return bool(m and known and m.group("game").replace("_", "").lower() in known)
