"""Independent numpy reference of Fed-MTL's rounds (float64, a Python loop over clients),
written from FedRep's authors' LocalUpdateMTL: the cohort's models as the columns of an
explicit W [p, m], an explicit Omega [m, m], and the regulariser's gradient by hand.

Params are nn_reference's flat dicts (an MLP); W's rows are every parameter but an
embedding ('body/embed/...'), in sorted name order. Local training is nn_reference's
`sgd` (the package's shuffles), without weight decay.
"""

import math

import jax
import numpy as np

import nn_reference as ref

EXCLUDED = "body/embed/"


def names(params: dict) -> list[str]:
  """The params in W, in W's row order."""
  return sorted(p for p in params if not p.startswith(EXCLUDED))


def column(params: dict) -> np.ndarray:
  """The params in W flattened into one column [p]."""
  return np.concatenate([np.ravel(params[p]) for p in names(params)]).astype(np.float64)


def unflatten(vector: np.ndarray, like: dict) -> dict:
  """A dict of the params in W shaped like `like`'s, from a column [p]."""
  out, start = {}, 0
  for p in names(like):
    size = np.size(like[p])
    out[p] = vector[start:start + size].reshape(np.shape(like[p]))
    start += size
  return out


def omega(kind: str, m: int) -> np.ndarray:
  """Omega [m, m]: C = I - 1 1^T / m squared element-wise with I the identity ("eye") or
  the all-ones matrix ("ones", LG-FedAvg's and PFLlib's I), or C @ C ("centering")."""
  ones = np.ones((m, m))
  if kind == "centering":
    c = np.eye(m) - ones / m
    return c @ c
  c = (np.eye(m) if kind == "eye" else ones) - ones / m
  return c**2


def authors_lambda(p: int) -> float:
  """The authors' scale of the regulariser for W with p rows."""
  f = int(math.log10(p) + 1) + 1
  return 10.0**(-f)


def regulariser(w: np.ndarray, lam: float, om: np.ndarray) -> float:
  """lam (||W||_F^2 + tr(W Omega W^T)) of W [p, m]."""
  return lam * (np.sum(w**2) + np.trace(w @ om @ w.T))


def regulariser_grad(w: np.ndarray, j: int, lam: float, om: np.ndarray) -> np.ndarray:
  """Its gradient [p] in column j: lam (2 W e_j + W (Omega + Omega^T) e_j)."""
  return lam * (2 * w[:, j] + w @ (om[:, j] + om[j, :]))


def mtl_round(personal: list[dict], key, data, hp, clients, mask=None, *, lam: float | None,
              kind: str = "ones", local_epochs: int, batch_size: int):
  """One round: (personal, train_loss). The clients of `clients` where `mask` is True train
  (key fold_in(key, i)), the j-th of them on CE + the regulariser of column j of W, whose
  columns are their round-start models (in cohort order), Omega `omega(kind, m)`, m their
  number, lam the weight (None: `authors_lambda`). SGD as nn_reference's, weight decay 0.
  train_loss: the count-weighted mean of their mean CE (0 if none)."""
  mask = [True] * len(clients) if mask is None else list(mask)
  cohort = [int(i) for i, trains in zip(clients, mask) if trains]
  new_personal = [dict(p) for p in personal]
  if not cohort:
    return new_personal, 0.0
  w_start = np.stack([column(personal[i]) for i in cohort], axis=1)
  om = omega(kind, len(cohort))
  lam = authors_lambda(w_start.shape[0]) if lam is None else lam
  no_decay = hp.replace(weight_decay=0.0)
  loss_sum, total = 0.0, 0
  for j, i in enumerate(cohort):

    def grad_fn(params, xb, yb, j=j):
      loss, grads = ref.loss_and_grads(params, xb, yb)
      w = w_start.copy()
      w[:, j] = column(params)
      extra = unflatten(regulariser_grad(w, j, lam, om), params)
      return loss, {p: g + extra.get(p, 0.0) for p, g in grads.items()}

    count = int(data.counts[i])
    new_personal[i], loss = ref.sgd(personal[i], list(personal[i]), grad_fn,
                                    np.asarray(data.x[i], np.float64), np.asarray(data.y[i]),
                                    count, jax.random.fold_in(key, i), no_decay,
                                    local_epochs, batch_size)
    loss_sum += count * loss
    total += count
  return new_personal, loss_sum / total
