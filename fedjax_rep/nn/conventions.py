"""Training conventions where the papers' own code differs from their text, as named knobs.

FedRep's (lgcollins/FedRep) and FLUTE's (RenpuLiu/flute, forked from it) PyTorch code
train in ways the papers do not state, or state otherwise. Each difference is a knob with
two values, "paper" (the engine's default) and their code's ("authors"); `PRESETS` sets
them together and `resolve` takes a preset with single knobs changed. The "paper" value
is the paper's text where it is explicit (feature_penalty, flute_star_order), our
reading where it is silent (starting_heads, bias_decay), and for averaging the engine's
count weighting, although FedRep's Algorithm 1 is uniform (so "paper" keeps the numbers
of every run made before these knobs):

- feature_penalty (FLUTE, Eq. 10's lambda1 ||psi(x)||^2): "mean" over a minibatch's rows
  (Eq. 10), or "sum" over them (FLUTE's code: lambda1 times the batch size as a mean).
- flute_star_order (FLUTE*): "joint-first", the joint epochs then the head epochs, each
  phase with a fresh optimiser (Sec. 7.2's description), or "head-first", the head epochs
  (body frozen) then the joint ones with one optimiser and its momentum throughout
  (FLUTE's code).
- starting_heads (FedRep, FedPer, LG-FedAvg, FLUTE): a client that has not trained yet
  starts from, and is tested with, its "initial" personal params (our reading of the
  papers, which are silent: every client starts from the initial model), or the "averaged" ones: the mean, weighted as
  the server averages, of the personal params the last round's cohort trained (both
  codes, whose untrained clients' personal params alias the global model, into which
  the server loads every averaged parameter, heads included).
- bias_decay (local SGD of every algorithm): weight decay "on" every parameter (our
  reading of the papers' "weight decay 1e-4"), or "off" for biases (both codes put biases in an
  optimiser group without weight decay).
- averaging (the server's mean of the shared params, and of train_loss): weighted by the
  clients' sample counts ("samples"; FedAvg's rule) or "uniform" over the cohort
  (FedRep's Algorithm 1; both codes on CIFAR; on LEAF's data they weight by counts).

The "paper" values are the engine's defaults. The traced ones are `hparams.options`
flags (OPTIONS below; absent is the paper's value, so a run with the papers' conventions
is the same program as before these knobs); flute_star_order is structure (the
`Flute.head_first` field).
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
OPTIONS = {"feature_penalty": "feature_sum", "starting_heads": "average_untrained",
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
FLAGS = {flag: Option(flag, 0.0, help=f"1: the authors' code's {knob} ({HELP[knob]})", flag=True)
         for knob, flag in OPTIONS.items()}


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
    knobs = [k for k in OPTIONS if self.authors(k) and (
        algorithm is None or OPTIONS[k] in declared(algorithm))]
    return {OPTIONS[k]: 1.0 for k in knobs}

  def head_first(self) -> bool:
    """`Flute.head_first`: FLUTE*'s head epochs before its joint ones."""
    return self.authors("flute_star_order")

  def described(self) -> dict:
    """{knob: value} (what config.json records)."""
    return dataclasses.asdict(self)


PRESETS = {PAPER: Conventions(),
           AUTHORS: Conventions(**{knob: values[1] for knob, values in KNOBS.items()})}


def resolve(preset: str = PAPER, **knobs) -> Conventions:
  """The conventions of `preset` ("paper" or "authors") with the knobs given (a value of
  KNOBS; None: the preset's) changed.

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
  uniform = hparams.options.get(OPTIONS["averaging"])
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
  flag = hparams.options.get(OPTIONS["starting_heads"])
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
