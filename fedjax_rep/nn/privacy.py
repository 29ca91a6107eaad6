"""User-level differential privacy of the shared parameters: the Gaussian mechanism on the
cohort's clipped updates (`private_mean`), as traced options of every neural algorithm.

With the option dp_clip C given, each sampled client's update of the shared parameters
(what it sends minus the round's values, over the leaves it shares) is clipped to L2 norm
C; the server sums the clipped updates with equal weights, adds Gaussian noise of std
dp_noise * C per coordinate (drawn from the round's key) and divides by the fixed cohort
size, so the average carries noise of std dp_noise * C / cohort. With dp_poisson the
cohort is Poisson-sampled (`poisson_mask`). Personal parameters never enter it.
`refusal` and `run_refusal` name the algorithms and runs it cannot privatise
(`fedjax_rep.privacy.accountant` accounts the mechanism).
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.nn import conventions
from fedjax_rep.nn.hparams import Option

CLIP = Option("dp_clip", None, low=0.0, open=True, set_by_recipe=True,
              help="user-level DP: clip each sampled client's update of the shared "
                   "parameters to this L2 norm (given: the server averages the clipped "
                   "updates over the fixed cohort and adds Gaussian noise)")
NOISE = Option("dp_noise", 0.0, set_by_recipe=True,
               help="user-level DP: the noise multiplier, the Gaussian noise's std over "
                    "dp_clip on the sum of the cohort's clipped updates")
POISSON = Option("dp_poisson", 0.0, flag=True, set_by_recipe=True,
                 help="user-level DP: 1: Poisson sampling, each client joins a round with "
                      "probability cohort / n, truncated to the cohort; 0: the fixed-size "
                      "cohort")
OPTIONS = (CLIP, NOISE, POISSON)
# The hooks whose override makes a server that this mechanism cannot privatise by itself.
ROUND_HOOKS = ("round", "masked_round", "train_clients", "server_step")


def active(hparams) -> bool:
  """Whether `hparams` ask for the mechanism (the option dp_clip is given)."""
  return CLIP.name in hparams.options


def poisson_mask(key, num_clients: int, cohort: int, hparams) -> jax.Array | None:
  """Which of a round's cohort [cohort] trains under Poisson sampling (the option dp_poisson
  1), None where hparams do not ask for it (all of them train).

  Of a cohort drawn uniformly without replacement in random order, the first K, K ~
  Binomial(num_clients, cohort / num_clients) from `key`: each client joins with
  probability cohort / num_clients, and where more than `cohort` join, a uniformly random
  `cohort` of them train (truncated Poisson sampling, as `privacy.accountant` accounts it).
  Returns a bool [cohort] (all True where the flag is 0) or None."""
  if POISSON.name not in hparams.options:
    return None
  joined = jax.random.binomial(key, num_clients, cohort / num_clients)
  return jnp.where(hparams.options[POISSON.name] > 0, jnp.arange(cohort) < joined, True)


def refusal(algorithm_class) -> str | None:
  """Why the neural algorithm class cannot run under the mechanism, or None where it can:
  a round that moves client data to the server outside `server_update` (FLUTE's server
  head step, L2GD's averaging, Fed-MTL's cohort sum) or a `server_update` that is not an
  average of what the clients send (SCAFFOLD's control variates), unless the class says
  its server averages (`private_server`)."""
  hooks = [h for h in ROUND_HOOKS if algorithm_class.overrides(h)]
  if hooks:
    return (f"its round overrides {', '.join(hooks)}: the server sees client data besides "
            f"the shared parameters' updates, which the mechanism does not privatise")
  if algorithm_class.overrides("server_update") and not algorithm_class.private_server:
    return ("its server_update is not an average of the clients' updates (e.g. control "
            "variates), which the mechanism does not privatise")
  return None


def run_refusal(algorithm, num_clients: int, hparams) -> str | None:
  """Why `algorithm` (a neural Algorithm) cannot run under the mechanism with `hparams` on
  num_clients clients, or None: its class's `refusal`, its sharding over devices, a cohort
  stratified over groups (not the sampling the accountant assumes), Poisson sampling at
  full participation, or a server that averages personal parameters (average_untrained)."""
  flag = lambda option: np.any(np.asarray(hparams.options.get(option, 0)) > 0)
  if (why := refusal(type(algorithm))) is not None:
    return why
  if algorithm.devices is not None:
    return f"it is sharded over {algorithm.devices} devices"
  if algorithm.cohort_groups is not None:
    return (f"its cohort is stratified over {algorithm.cohort_groups} groups, not the "
            f"uniform sampling the accountant assumes")
  if algorithm.cohort >= num_clients and flag(POISSON.name):
    return (f"Poisson sampling (dp_poisson) needs a cohort below the {num_clients} clients: "
            f"at full participation every client trains every round")
  if flag(conventions.FLAGS["average_untrained"].name):
    return ("the option average_untrained makes the server average personal parameters "
            "(starting_heads=averaged)")
  return None


def shares(shared_leaves, leaf: str) -> jax.Array:
  """Whether clients share `leaf` (bool []; traced for a family program's member), of
  `shared_leaves` ({leaf: bool or bool []}; None: every leaf)."""
  return jnp.asarray(True if shared_leaves is None else shared_leaves[leaf])


def clipped_updates(reference: dict, sent: dict, weights, shared_leaves,
                    clip) -> tuple[dict, jax.Array]:
  """({leaf: [c, ...]} each client's update of the shared leaves, sent - reference, scaled
  to L2 norm at most `clip` over all its leaves (0 for a client of weight 0 and for the
  leaves it does not share), its norm before clipping [c]); the arguments as
  `private_mean`'s."""
  updates = {p: jnp.where(shares(shared_leaves, p), sent[p] - reference[p][None], 0.0)
             for p in sent}
  norms = jnp.sqrt(sum(jnp.sum(jnp.reshape(u, (u.shape[0], -1)) ** 2, axis=1)
                       for u in updates.values()))
  scale = jnp.where(weights > 0, jnp.minimum(1.0, clip / jnp.maximum(norms, 1e-30)), 0.0)
  return {p: u * scale.reshape(-1, *[1] * (u.ndim - 1)) for p, u in updates.items()}, norms


def private_mean(reference: dict, sent: dict, weights, shared_leaves, hparams, cohort: int,
                 key) -> tuple[dict, dict]:
  """(the private mean of the cohort's `sent` leaves, metrics).

  reference: the round's values of the leaves of `sent` (the server's shared params);
  sent: what the cohort sends, leaves [c, ...]; weights [c]: 0 for a client that did not
  train (masked), else any positive number (not used as a weight); shared_leaves: {leaf:
  bool or bool []}, the leaves each client shares (None: all of `sent`'s; the others are
  left at `reference`, no noise); hparams: with dp_clip and dp_noise; cohort: the fixed
  cohort size the sum is divided by; key: the round's noise key.

  Returns:
    ({leaf: reference + (sum_i clip(update_i) + noise) / cohort}, {"dp_clipped": the
    fraction of the clients that trained whose update was clipped, []}).
  """
  clip = hparams.options[CLIP.name]
  noise = hparams.options.get(NOISE.name, NOISE.default)
  updates, norms = clipped_updates(reference, sent, weights, shared_leaves, clip)
  keys = dict(zip(sent, jax.random.split(key, len(sent))))
  mean = {}
  for p, u in updates.items():
    drawn = jax.random.normal(keys[p], u.shape[1:], u.dtype) * noise * clip
    mean[p] = reference[p] + (jnp.sum(u, axis=0)
                              + jnp.where(shares(shared_leaves, p), drawn, 0.0)) / cohort
  trained = weights > 0
  clipped = jnp.sum(trained & (norms > clip)) / jnp.maximum(jnp.sum(trained), 1)
  return mean, {"dp_clipped": clipped.astype(jnp.float32)}
