"""Policy / value networks built from the specs agreed in the handshake.

Models never see a gymnasium env: `build_actor_critic(model_cfg, obs_spec,
action_spec)` is all the learner, the actors and the agent server need. A
`PolicyHead` turns torso features into distribution parameters and knows how
to sample, score (`log_prob`, which gives trajectories' `behaviour_logp`),
and measure entropy, so algorithms are written once for Discrete and Box.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from zrl import _core, spaces
from zrl.config import ModelConfig

__all__ = ["PolicyHead", "CategoricalHead", "GaussianHead", "ActorCritic", "QNetwork", "build_actor_critic", "flatten_parameters", "mlp", "preprocess"]


def _act(name: str) -> type[nn.Module]:
    return {"tanh": nn.Tanh, "relu": nn.ReLU}[name]


def mlp(in_dim: int, sizes: tuple[int, ...], activation: str) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in sizes:
        lin = nn.Linear(in_dim, h)
        nn.init.orthogonal_(lin.weight, math.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers += [lin, _act(activation)()]
        in_dim = h
    return nn.Sequential(*layers)


def _check_no_core(cfg: ModelConfig, what: str) -> None:
    if cfg.lstm_size > 0:
        raise NotImplementedError(f"model.lstm_size > 0: {what} has no LSTM core (set model.lstm_size: 0)")


def _cnn_torso(cfg: ModelConfig, obs_spec: spaces.Spec) -> nn.Module:
    from zrl.models.cnn import build_cnn_torso  # cnn.py imports preprocess from here

    return build_cnn_torso(cfg, obs_spec)


def flatten_parameters(model: nn.Module) -> torch.Tensor:
    """Moves every parameter into one contiguous buffer and returns it; the parameters
    become views of it. Publishing weights then reads the buffer without a copy of its
    own, and applying received weights is one copy into it. Call before making an
    optimiser (it keeps the same Parameter objects, only their storage changes)."""
    params = list(model.parameters())
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        offset = 0
        for p in params:
            n = p.numel()
            p.data = flat[offset : offset + n].view_as(p)
            offset += n
    return flat


def preprocess(obs: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Observations arrive in their wire dtype; uint8 images are scaled to [0, 1] here, on the
    model's device, in the model's dtype (float32, or bfloat16 for a bf16 actor)."""
    if obs.dtype == torch.uint8:
        return obs.to(dtype).mul_(1.0 / 255.0)
    return obs.to(dtype)


class PolicyHead(nn.Module):
    """Features -> distribution parameters, plus the distribution's operations on them."""

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward_float(self, h: torch.Tensor) -> torch.Tensor:
        """The parameters in float32, from features of any dtype (what actors sample from)."""
        return self(h).float()

    def sample_with_log_prob(self, params: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(actions, log-probabilities of them) as numpy arrays, for acting (no autograd)."""
        action = self.sample(params)
        return action.numpy(), self.log_prob(params, action).numpy()


class CategoricalHead(PolicyHead):
    def __init__(self, in_dim: int, n: int):
        super().__init__()
        self.linear = nn.Linear(in_dim, n)
        nn.init.orthogonal_(self.linear.weight, 0.01)
        nn.init.zeros_(self.linear.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(h)  # logits

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(torch.softmax(params, -1), 1).squeeze(-1)

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return params.argmax(-1)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(params, -1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(params, -1)
        return -(logp.exp() * logp).sum(-1)

    def forward_float(self, h: torch.Tensor) -> torch.Tensor:
        # A bf16 model's 256 -> n layer in fp32 (its few weights cast per call): oneDNN takes
        # ~15 us for the bf16 one on 8 rows, ~3 us for fp32.
        lin = self.linear
        return F.linear(h.float(), lin.weight.float(), lin.bias.float())

    def sample_with_log_prob(self, params: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        # zrl's C++ draw (inverse CDF, one pass per row) instead of multinomial, log_softmax and
        # gather: ~25 us less per act() call. The uniforms come from torch's generator, so
        # torch.manual_seed still fixes the actions.
        if params.device.type != "cpu" or params.dtype != torch.float32 or params.dim() != 2:
            return super().sample_with_log_prob(params)
        u = torch.rand(params.shape[0], dtype=torch.float64)
        return _core.sample_categorical(params.contiguous().numpy(), u.numpy())


class GaussianHead(PolicyHead):
    """Diagonal Gaussian with a state-independent log std; params = [mean, log_std]."""

    def __init__(self, in_dim: int, action_dim: int):
        super().__init__()
        self.mean = nn.Linear(in_dim, action_dim)
        nn.init.orthogonal_(self.mean.weight, 0.01)
        nn.init.zeros_(self.mean.bias)
        self.log_std = nn.Parameter(torch.zeros(action_dim))
        self.action_dim = action_dim

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        mean = self.mean(h)
        return torch.cat([mean, self.log_std.expand_as(mean)], -1)

    def _split(self, params):
        return params[..., : self.action_dim], params[..., self.action_dim :]

    def sample(self, params):
        mean, log_std = self._split(params)
        return mean + log_std.exp() * torch.randn_like(mean)

    def mode(self, params):
        return self._split(params)[0]

    def log_prob(self, params, actions):
        mean, log_std = self._split(params)
        z = (actions - mean) / log_std.exp()
        return (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self, params):
        _, log_std = self._split(params)
        return (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)


def make_head(in_dim: int, action_spec: spaces.Spec) -> PolicyHead:
    if isinstance(action_spec, spaces.DiscreteSpec):
        return CategoricalHead(in_dim, action_spec.n)
    if isinstance(action_spec, spaces.BoxSpec):
        return GaussianHead(in_dim, math.prod(action_spec.shape))
    raise ValueError(f"no policy head for {action_spec}")


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
            self.pi_torso = _cnn_torso(cfg, obs_spec)
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
        return preprocess(obs, self.dtype).reshape(obs.shape[0], self.obs_dim)

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


class QNetwork(nn.Module):
    """Observation -> Q(s, .) [N, n_actions], with an optional dueling head."""

    def __init__(self, cfg: ModelConfig, obs_spec: spaces.Spec, action_spec: spaces.Spec, dueling: bool = True):
        super().__init__()
        _check_no_core(cfg, "the Q-network (apex_dqn)")
        if not isinstance(action_spec, spaces.DiscreteSpec):
            raise ValueError(f"Q-learning needs discrete actions, got {action_spec}")
        if not isinstance(obs_spec, spaces.BoxSpec):
            raise ValueError(f"observations must be a box, got {obs_spec}")
        self.obs_dim = math.prod(obs_spec.shape)
        self.cnn = cfg.network != "mlp"
        if self.cnn:
            self.torso = _cnn_torso(cfg, obs_spec)
            out = self.torso.out_dim
        else:
            out = cfg.hidden_sizes[-1] if cfg.hidden_sizes else self.obs_dim
            self.torso = mlp(self.obs_dim, cfg.hidden_sizes, cfg.activation)
        self.dueling = dueling
        self.advantage = nn.Linear(out, action_spec.n)
        self.value = nn.Linear(out, 1) if dueling else None

    @property
    def dtype(self) -> torch.dtype:
        return self.advantage.weight.dtype

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.torso(obs if self.cnn else preprocess(obs, self.dtype).reshape(obs.shape[0], self.obs_dim))
        adv = self.advantage(h)
        if not self.dueling:
            return adv
        return self.value(h) + adv - adv.mean(-1, keepdim=True)
