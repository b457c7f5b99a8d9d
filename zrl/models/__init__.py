"""Policy / value networks built from the specs agreed in the handshake.

Models never see a gymnasium env: `build_actor_critic(model_cfg, obs_spec,
action_spec)` is all the learner, the actors and the agent server need. The
package re-exports the names other code imports; the modules are `mlp_torso`,
`cnn` (the IMPALA CNN torsos), `heads` (policy heads), `actor_critic`,
`q_network`, `params` (flatten_parameters), `inputs` (preprocess) and the actors'
int8 acting paths `int8` and `int8_torso`.
"""
from __future__ import annotations

from zrl.models.actor_critic import ActorCritic, build_actor_critic
from zrl.models.heads import CategoricalHead, GaussianHead, PolicyHead, make_head
from zrl.models.inputs import preprocess
from zrl.models.mlp_torso import mlp
from zrl.models.params import flatten_parameters
from zrl.models.q_network import QNetwork

__all__ = ["PolicyHead", "CategoricalHead", "GaussianHead", "ActorCritic", "QNetwork", "build_actor_critic", "flatten_parameters", "make_head",
           "mlp", "preprocess"]
