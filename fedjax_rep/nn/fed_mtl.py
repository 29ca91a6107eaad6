"""Fed-MTL (Smith et al. 2017, MOCHA's objective) as FedRep's authors ran it (main_mtl.py,
models/Update.py::LocalUpdateMTL): every client's whole model is personal, trained with a
regulariser that couples the cohort's models; nothing is averaged.

The m clients that train this round (masked ones do not) form W [p, m] of their models
flattened (p parameters: all but an embedding 'body/embed/...'), fixed at the round's
start. Client j trains for `local_epochs` of SGD (momentum `hparams.momentum`, no weight
decay) on CE + lambda (||W||_F^2 + tr(W Omega W^T)), column j of W its live w_j. With
Omega = a I_m + b 1 1^T that is lambda ((1 + a) ||w_j||^2 + b ||s||^2) up to a constant,
s = S - w_j(start) + w_j, S the sum of the round-start models (`cohort_sum`, a psum when
sharded). The traced choice `mtl_omega`: "ones" (default; a = 0, b = (1 - 1/m)^2), "eye"
(a = 1 - 2/m, b = 1/m^2) or "centering" (a = 1, b = -1/m); lambda: the traced option
"mtl_lambda", absent 10^-(floor(log10 p) + 2). The embedding is personal and trained, not
in W. Clients are tested with their own model; the reported loss is the cross-entropy.
Departures from the authors' code: docs/papers/fedrep.md.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from optax import tree_utils as otu

from fedjax_rep.core import checks
from fedjax_rep.core import tree
from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import train
from fedjax_rep.nn.algorithm import Personalized
from fedjax_rep.nn.hparams import Option

EXCLUDED = "body/embed/"  # parameters outside W
# What `client_update` finds in `shared`: 'cohort/<param>', the sum S of the cohort's
# round-start models, and 'cohort_size', m.
COHORT, COHORT_SIZE = "cohort/", "cohort_size"
OMEGAS = ("ones", "eye", "centering")


def regularised(flat: dict) -> dict:
  """The parameters in W (all but the embedding's)."""
  return {p: v for p, v in flat.items() if not p.startswith(EXCLUDED)}


def omega_coefficients(omega: str, m):
  """(a, b) of Omega = a I_m + b 1 1^T for `mtl_omega` omega and cohort size m."""
  if omega == "eye":
    return 1 - 2 / m, 1 / m**2
  if omega == "ones":
    return 0.0, (1 - 1 / m)**2
  return 1.0, -1 / m


def chosen_coefficients(index, m) -> jax.Array:
  """(a, b) [2] of `omega_coefficients` for the `mtl_omega` OMEGAS[index] (index: a number
  or float [], traced or not) and cohort size m []."""
  table = jnp.stack([jnp.stack(omega_coefficients(omega, m)) for omega in OMEGAS])
  return table[jnp.asarray(index, jnp.int32)]


def default_lambda(p: int) -> float:
  """The authors' scale of the regulariser for p parameters in W: 10^-(floor(log10 p) + 2)."""
  return 10.0**-(len(str(p)) + 1)


@dataclasses.dataclass(frozen=True)
class FedMTL(Personalized):
  name: str = "fed-mtl"
  options = (Option("mtl_lambda", None, help="Fed-MTL's regulariser weight (default: the "
                                               "authors' scale 10^-f of the model's size)"),
             Option("mtl_omega", OMEGAS[0], choices=OMEGAS,
                    help="Fed-MTL's Omega: ones (what the authors' code ran), eye "
                         "(identity-based), centering (MOCHA's I - 11^T/m)"))

  def labels(self, flat):
    return params_lib.all_personal(flat)

  def check(self, data, hparams):
    lam = hparams.options.get("mtl_lambda")
    if lam is not None and checks.concrete(lam) and not np.all(np.asarray(lam) >= 0):
      raise ValueError(f"mtl_lambda = {lam} is out of range: it must be finite and >= 0; "
                       f"pass hparams(..., mtl_lambda=...) >= 0, or none for the default")
    super().check(data, hparams)

  def train_clients(self, state, key, data, hparams, rows, clients, info, mask=None):
    """The base's, with the sum S of the training clients' round-start models and their
    number m handed to `client_update` in `shared` (COHORT, COHORT_SIZE)."""
    trains = jnp.ones(rows.shape) if mask is None else mask.astype(jnp.float32)
    total, size = self.cohort_sum(regularised(tree.gather(state.personal, rows)), trains)
    cohort = {**{COHORT + p: v for p, v in total.items()}, COHORT_SIZE: size}
    trained, sent, weights, losses = super().train_clients(
        state.replace(shared={**state.shared, **cohort}), key, data, hparams, rows, clients,
        info, mask)
    return trained.replace(shared=state.shared), sent, weights, losses

  def exchanged(self, shared, personal, hparams):
    """The client's round-start model (its params in W) up; the sum S of the cohort's and
    their number m down (what `train_clients` hands `client_update` in `shared`)."""
    model = regularised(personal)
    down = {**{COHORT + p: v for p, v in model.items()},
            COHORT_SIZE: jax.ShapeDtypeStruct((), jnp.float32)}
    return model, down, 1.0

  def regulariser(self, w: dict, others: dict, m, hparams):
    """lambda (||W||_F^2 + tr(W Omega W^T)) as a function of one column w of W [p, m] (flat
    params, those in W), up to a constant: `others` the sum of the other m - 1 columns."""
    a, b = chosen_coefficients(self.option(hparams, "mtl_omega"), m)
    lam = hparams.options.get("mtl_lambda", default_lambda(sum(v.size for v in w.values())))
    return lam * ((1 + a) * otu.tree_norm(w, squared=True)
                  + b * otu.tree_norm(otu.tree_add(others, w), squared=True))

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    others = {p: shared[COHORT + p] - v for p, v in regularised(personal).items()}
    m = jnp.maximum(shared[COHORT_SIZE], 1.0)  # 0 only where every client is masked

    def loss(params, xb, yb, wb, k):
      penalty = self.regulariser(regularised(params), others, m, hparams)
      return self.loss(params, xb, yb, wb, k) + train.gradient_only(penalty)

    no_decay = hparams.replace(weight_decay=jnp.zeros_like(hparams.weight_decay))
    trained, mean_loss = self.sgd(loss, personal, x, y, count, key, no_decay,
                                  self.local_epochs)
    return {}, trained, mean_loss
