"""Parameters as flat dicts {'body/conv1/kernel': array, ..., 'head/bias': array}, and the
label trees that say which are shared (averaged by the server) and which personal.

A label tree maps every parameter path to 'shared' or 'personal', as the labels of
`optax.multi_transform` do. An algorithm's state keeps the two parts apart: the shared
ones once, the personal ones with a leading client axis.
"""

from collections.abc import Callable

from fedjax_rep.core.tree import flatten, unflatten  # noqa: F401  params as flat dicts

SHARED, PERSONAL = "shared", "personal"


def layers(flat: dict) -> list[str]:
  """Layer paths in network order: the body's layers (their names sort in order: conv1,
  conv2, fc1, ...), then 'head'."""
  names = {path.rsplit("/", 1)[0] for path in flat}
  return sorted(n for n in names if n != "head") + ["head"]


def head_personal(flat: dict) -> dict:
  """Label tree of FedRep and FedPer: the head (last layer) personal, the body shared."""
  return {p: PERSONAL if p.startswith("head/") else SHARED for p in flat}


def last_layers_shared(count: int) -> Callable[[dict], dict]:
  """Label tree of LG-FedAvg: the last `count` layers shared (global), the rest personal."""

  def labels(flat: dict) -> dict:
    shared = set(layers(flat)[-count:])
    return {p: SHARED if p.rsplit("/", 1)[0] in shared else PERSONAL for p in flat}

  return labels


def all_shared(flat: dict) -> dict:
  """Label tree of FedAvg: one global model."""
  return {p: SHARED for p in flat}


def all_personal(flat: dict) -> dict:
  """Label tree of local-only training: nothing is shared."""
  return {p: PERSONAL for p in flat}


def split(flat: dict, labels: dict) -> tuple[dict, dict]:
  """(shared, personal) flat dicts of `flat` by its label tree."""
  return ({p: v for p, v in flat.items() if labels[p] == SHARED},
          {p: v for p, v in flat.items() if labels[p] == PERSONAL})


def merge(*parts: dict) -> dict:
  """One flat dict of disjoint parts."""
  return {p: v for part in parts for p, v in part.items()}
