"""Training conventions where the papers' own code differs from their text, as named knobs.

Each knob has two values, "paper" (the engine's default) and "authors" (the code of
lgcollins/FedRep and of RenpuLiu/flute, forked from it); `PRESETS` sets them together and
`resolve` takes a preset with single knobs changed:
- feature_penalty (FLUTE, Eq. 10's lambda1 ||psi(x)||^2): "mean" or "sum" over a minibatch;
- flute_star_order (FLUTE*): "joint-first" (the joint then the head epochs, a fresh
  optimiser each) or "head-first" (the head epochs first, one optimiser throughout);
- starting_heads (FedRep, FedPer, LG-FedAvg, FLUTE): an untrained client starts from, and
  is tested with, the "initial" personal params or the "averaged" ones (the last cohort's
  trained ones, weighted as the server averages);
- bias_decay: weight decay "on" every parameter, or "off" for biases;
- averaging (the shared params and train_loss): by sample counts ("samples") or "uniform".
The traced knobs are `hparams.options` flags (FLAG_OF; absent is "paper"'s value);
flute_star_order is structure (`Flute.head_first`). Each value's source: docs/neural.md.
"""

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_rep.core import aggregate
from fedjax_rep.core import tree
from fedjax_rep.nn.hparams import Option, declared

PAPER, AUTHORS = "paper", "authors"

# knob -> (the papers' value, the authors' code's value)
KNOBS = {"feature_penalty": ("mean", "sum"),
         "flute_star_order": ("joint-first", "head-first"),
         "starting_heads": ("initial", "averaged"),
         "bias_decay": ("on", "off"),
         "averaging": ("samples", "uniform")}
# Knob -> the traced flag of `hparams.options` that is 1 where the knob has the authors'
# value (flute_star_order is structure: `Flute.head_first`).
FLAG_OF = {"feature_penalty": "feature_sum", "starting_heads": "average_untrained",
           "bias_decay": "no_bias_decay", "averaging": "uniform_average"}
HELP = {
    "feature_penalty": "FLUTE's lambda1 ||psi(x)||^2 over a minibatch: the mean over its rows "
                       "(Eq. 10) or their sum (FLUTE's code)",
    "flute_star_order": "FLUTE*'s order: joint epochs first, a fresh optimiser per phase "
                        "(Sec. 7.2), or head epochs first, one optimiser throughout (FLUTE's "
                        "code)",
    "starting_heads": "personal params of a client that has not trained yet: the initial ones "
                      "(default) or the last cohort's average (FedRep's and FLUTE's code; "
                      "FedRep, FedPer, LG-FedAvg, FLUTE)",
    "bias_decay": "weight decay of local SGD on biases: on (default) or off (FedRep's and "
                  "FLUTE's code)",
    "averaging": "the server's mean over the cohort: weighted by sample counts, or uniform "
                 "(FedRep's and FLUTE's code on CIFAR)",
}


# Traced flag -> its `Option` (declared by the algorithms that read it).
FLAGS = {flag: Option(flag, 0.0, help=f"1: the authors' code's {knob} ({HELP[knob]})", flag=True,
                      set_by_recipe=True)
         for knob, flag in FLAG_OF.items()}


@dataclasses.dataclass(frozen=True)
class Conventions:
  """One value of each knob (see the module docstring); the defaults are "paper"'s."""
  feature_penalty: str = KNOBS["feature_penalty"][0]
  flute_star_order: str = KNOBS["flute_star_order"][0]
  starting_heads: str = KNOBS["starting_heads"][0]
  bias_decay: str = KNOBS["bias_decay"][0]
  averaging: str = KNOBS["averaging"][0]

  def authors(self, knob: str) -> bool:
    """Whether `knob` has the authors' code's value."""
    return getattr(self, knob) == KNOBS[knob][1]

  def options(self, algorithm=None) -> dict:
    """The `hparams.options` flags of these conventions: 1.0 for each traced knob with the
    authors' value (the paper's are absent: the engine's defaults); with `algorithm` (a
    `Personalized`), only those it declares (`hparams.declared`: average_untrained is
    FedRep's, FedPer's, LG-FedAvg's and FLUTE's)."""
    knobs = [k for k in FLAG_OF if self.authors(k) and (
        algorithm is None or FLAG_OF[k] in declared(algorithm))]
    return {FLAG_OF[k]: 1.0 for k in knobs}

  def head_first(self) -> bool:
    """`Flute.head_first`: FLUTE*'s head epochs before its joint ones."""
    return self.authors("flute_star_order")

  def described(self) -> dict:
    """{knob: value} (what config.json records)."""
    return dataclasses.asdict(self)


PRESETS = {PAPER: Conventions(),
           AUTHORS: Conventions(**{knob: values[1] for knob, values in KNOBS.items()})}


def resolve(preset: str = PAPER, **knobs) -> Conventions:
  """The conventions of `preset` with the knobs given changed.

  Args:
    preset: "paper" or "authors" (a key of PRESETS).
    **knobs: knob=value, a knob of KNOBS and one of its values (None: the preset's).

  Returns:
    The `Conventions` (one value of each knob).

  Raises:
    ValueError: an unknown preset, knob or value.
  """
  if preset not in PRESETS:
    raise ValueError(f"conventions={preset!r}: must be one of {sorted(PRESETS)}")
  for knob, value in knobs.items():
    if knob not in KNOBS:
      raise ValueError(f"unknown convention {knob!r}; known: {sorted(KNOBS)}")
    if value is not None and value not in KNOBS[knob]:
      raise ValueError(f"{knob}={value!r}: must be one of {', '.join(KNOBS[knob])}")
  return dataclasses.replace(PRESETS[preset],
                             **{k: v for k, v in knobs.items() if v is not None})



def client_weights(data, rows, hparams, mask=None) -> jax.Array:
  """The server's weights [c] of the clients at rows `rows` [c] of `data`: their sample
  counts, or 1 each with the flag uniform_average (averaging="uniform"); 0 where `mask`
  [c] (bool; None: all) is False."""
  weights = data.sample_counts(rows)
  uniform = hparams.options.get(FLAG_OF["averaging"])
  if uniform is not None:
    weights = jnp.where(uniform > 0, jnp.ones_like(weights), weights)
  return weights if mask is None else jnp.where(mask, weights, 0.0)


def start_untrained(state, clients, weights, mask, hparams, shares_params=True):
  """After a round of clients `clients` [c] (those where `mask` [c] is True trained;
  None: all) with the server's weights [c]: with the flag average_untrained set to 1
  (starting_heads="averaged"), every client that has not trained yet takes as its personal
  params their mean over the clients that trained (weighted by `weights`; nothing where
  the weights sum to 0, or where `shares_params` (bool or bool []) is False), as in the
  authors' code, where such a client's personal params are the global model's, which the
  server overwrites with its averages of every parameter. `state` (an NNState) unchanged
  without the flag."""
  flag = hparams.options.get(FLAG_OF["starting_heads"])
  if flag is None:
    return state
  trained = jnp.ones(clients.shape, bool) if mask is None else mask
  untrained = state.untrained.at[clients].set(state.untrained[clients] & ~trained)
  sums, total = aggregate.weighted_sum(tree.gather(state.personal, clients), weights)
  start = untrained & (flag > 0) & (total > 0) & shares_params
  personal = jax.tree.map(
      lambda p, s: jnp.where(start.reshape(-1, *[1] * (p.ndim - 1)), s, p),
      state.personal, aggregate.mean(sums, total))
  return state.replace(personal=personal, untrained=untrained)
