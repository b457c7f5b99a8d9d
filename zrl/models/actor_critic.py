"""The actor-critic model: observation -> (policy parameters, value), with an MLP or CNN torso
and an optional LSTM core, built from the specs agreed in the handshake (the learner, the
actors and the agent server all call `build_actor_critic`)."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from zrl import spaces
from zrl.config import ModelConfig
from zrl.models.cnn import build_cnn_torso
from zrl.models.heads import CategoricalHead, make_head
from zrl.models.inputs import preprocess
from zrl.models.mlp_torso import mlp
from zrl.models.normalizer import RunningMeanStd

__all__ = ["ActorCritic", "build_actor_critic"]


class ActorCritic(nn.Module):
    """Observation -> (policy parameters [N, P], value [N]).

    An MLP torso sees flattened observations; a CNN torso (model.network
    impala_*) sees [N, C, H, W] as they arrive and is shared by policy and value.
    With model.lstm_size > 0 an LSTM core sits between the (then shared) torso
    and the heads: `step` advances it one step for N envs, `unroll` runs it over
    [T, B] with the state reset to zero wherever an episode starts.
    """

    def __init__(self, cfg: ModelConfig, obs_spec: spaces.Spec, action_spec: spaces.Spec):
        super().__init__()
        if not isinstance(obs_spec, spaces.BoxSpec):
            raise ValueError(f"observations must be a box, got {obs_spec}")
        self.obs_dim = math.prod(obs_spec.shape)
        self.cnn = cfg.network != "mlp"
        self.recurrent = cfg.lstm_size > 0
        if self.cnn:
            self.shared = True
            self.pi_torso = build_cnn_torso(cfg, obs_spec)
            self.v_torso = None
            out = self.pi_torso.out_dim
        else:
            out = cfg.hidden_sizes[-1] if cfg.hidden_sizes else self.obs_dim
            self.shared = cfg.shared_torso or self.recurrent
            self.pi_torso = mlp(self.obs_dim, cfg.hidden_sizes, cfg.activation)
            self.v_torso = None if self.shared else mlp(self.obs_dim, cfg.hidden_sizes, cfg.activation)
        self.core = nn.LSTMCell(out, cfg.lstm_size) if self.recurrent else None
        if self.recurrent:
            out = cfg.lstm_size
        self.obs_norm = RunningMeanStd((self.obs_dim,)) if cfg.normalize_obs else None
        self.head = make_head(out, action_spec)
        self._head_f32: tuple | None = None  # int8_logits: (key, head weights [hidden, n], bias [n]) in float32
        self.value = nn.Linear(out, 1)
        nn.init.orthogonal_(self.value.weight, 1.0)
        nn.init.zeros_(self.value.bias)

    @property
    def dtype(self) -> torch.dtype:
        return self.value.weight.dtype

    def _flat(self, obs: torch.Tensor) -> torch.Tensor:
        if self.cnn:
            return obs  # the CNN preprocesses its [N, C, H, W] input itself
        x = preprocess(obs, self.dtype).reshape(obs.shape[0], self.obs_dim)
        return x if self.obs_norm is None else self.obs_norm(x)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.recurrent:
            raise RuntimeError("a recurrent model runs with step() or unroll(), which carry its state")
        x = self._flat(obs)
        h = self.pi_torso(x)
        hv = h if self.shared else self.v_torso(x)
        return self.head(h), self.value(hv).squeeze(-1)

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """Policy parameters only (what an actor needs)."""
        return self.head(self.pi_torso(self._flat(obs)))

    def policy_float(self, obs: torch.Tensor) -> torch.Tensor:
        """Policy parameters in float32, the head computed in fp32 whatever the model's dtype."""
        return self.head.forward_float(self.pi_torso(self._flat(obs)))

    def int8_logits(self, obs: np.ndarray) -> np.ndarray | None:
        """An actor's logits, float32 [N, n] numpy, from uint8 frames [N, C, H, W] (numpy), where
        the torso is an Int8Torso running in zrl's own kernel and the head is categorical: the
        torso's features stay float32 numpy and the head runs in numpy (its weights copied in
        fp32 after each change the torso sees), with no torch op per call. Next to an actor's
        emulator threads the torch calls around the kernel (modules, dtype casts, inference
        mode) cost about as much CPU as the convolutions. None where this does not apply
        (then policy_float)."""
        int8 = getattr(self.pi_torso, "int8_torso", None)
        if (int8 is None or not int8.native or self.recurrent or not isinstance(self.head, CategoricalHead)
                or obs.dtype != np.uint8 or obs.ndim != 4 or not obs.flags.c_contiguous):
            return None
        feats = int8.features(obs)
        lin = self.head.linear
        key = (int8.generation, lin.weight.data_ptr(), lin.weight._version, lin.bias.data_ptr(), lin.bias._version)
        if self._head_f32 is None or self._head_f32[0] != key:
            w = np.ascontiguousarray(lin.weight.detach().float().numpy().T)  # [hidden, n]
            self._head_f32 = (key, w, lin.bias.detach().float().numpy().copy())
        _, w, b = self._head_f32
        logits = feats @ w
        logits += b
        return logits

    def value_only(self, obs: torch.Tensor) -> torch.Tensor:
        x = self._flat(obs)
        return self.value(self.pi_torso(x) if self.shared else self.v_torso(x)).squeeze(-1)

    # -- the LSTM core
    def initial_state(self, n: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        size = self.core.hidden_size
        return torch.zeros(n, size, device=device), torch.zeros(n, size, device=device)

    def step(self, obs: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        """One step for N envs: (policy parameters, value, new state)."""
        h, c = self.core(self.pi_torso(self._flat(obs)), state)
        return self.head(h), self.value(h).squeeze(-1), (h, c)

    def unroll(self, obs: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor], first: torch.Tensor):
        """obs [T, B, ...] from `state` ([B, H] each); first [T, B] marks episode starts (state reset to 0).

        Returns params [T, B, P], values [T, B] and the states after each step ([T, B, H] each).
        """
        T, B = obs.shape[:2]
        feats = self.pi_torso(self._flat(obs.reshape(T * B, *obs.shape[2:]))).reshape(T, B, -1)
        h, c = state
        hs, cs = [], []
        for t in range(T):
            keep = (~first[t]).float().unsqueeze(-1)
            h, c = self.core(feats[t], (h * keep, c * keep))
            hs.append(h)
            cs.append(c)
        h_all, c_all = torch.stack(hs), torch.stack(cs)
        return self.head(h_all), self.value(h_all).squeeze(-1), (h_all, c_all)

    def value_after(self, obs: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """V(obs) for N observations that continue from `state` (truncated episodes' final observations)."""
        h, _ = self.core(self.pi_torso(self._flat(obs)), state)
        return self.value(h).squeeze(-1)


def build_actor_critic(cfg: ModelConfig, obs_spec: spaces.Spec, action_spec: spaces.Spec) -> ActorCritic:
    return ActorCritic(cfg, obs_spec, action_spec)
