"""One traced program for neural algorithms that differ only in numbers: FedRep (and
FedRep*), FedPer, LG-FedAvg, FedAvg, FedAvg-FT and local only; and a FedAvg variant with
and without fine-tuning (FedProx and FedProx + FT, SCAFFOLD and SCAFFOLD + FT); FLUTE
and FLUTE*.

The first group share the model and the local SGD. What sets them apart is which
parameters the server averages, whether a client first trains its head alone with the body
frozen (FedRep's head epochs) and then only its body, how many epochs each phase runs, and
whether a client fine-tunes its head before it is tested (FedAvg-FT). `Family` runs any of
them from a `Member`, those choices as traced masks and counts in its hparams
(`FamilyHparams`), so that one compiled init, round chunk and evaluation serve every
member, where each algorithm compiles its own. The "-ft" variants differ from their base
only in the fine-tuning epochs before testing, and FLUTE* from FLUTE only in its head
epochs: counts that those algorithms also read as traced options (`hparams.FT_EPOCHS`,
`hparams.HEAD_EPOCHS`). `program` gives the program and hparams to run an algorithm with.

A `Family` state keeps the whole model twice: the server's copy (`shared`, of which the
member's shared leaves are used) and every client's (`personal`, leaves [n, ...], of which
the others are). A sampled client starts from the server's copy of the shared leaves and
its own copy of the rest, trains, and sends all its leaves; the server averages all of them
(count-weighted), and each client keeps all of its own. The numbers are those of the
member's own algorithm, with the same keys and steps (to float32 round-off: the programs
differ).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core import struct
from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import conventions
from fedjax_rep.nn.algorithm import Personalized
from fedjax_rep.nn.fedavg import FedAvg
from fedjax_rep.nn.fedper import FedPer
from fedjax_rep.nn.fedprox import FedProx
from fedjax_rep.nn.fedrep import FedRep
from fedjax_rep.nn.flute import Flute
from fedjax_rep.nn.hparams import FT_EPOCHS, HEAD_EPOCHS, NNHparams, epochs_option
from fedjax_rep.nn.lg_fedavg import LGFedAvg
from fedjax_rep.nn.local import Local
from fedjax_rep.nn.scaffold import Scaffold

MEMBERS = (FedRep, FedPer, LGFedAvg, FedAvg, Local)  # exactly these classes, not subclasses
# The classes that read one epoch count (a field) also as a traced option of that name
# (`hparams.FT_EPOCHS`, `hparams.HEAD_EPOCHS`): how many of those epochs run.
TRACED_EPOCHS = {FedAvg: FT_EPOCHS, FedProx: FT_EPOCHS, Scaffold: FT_EPOCHS,
                 Flute: HEAD_EPOCHS}
# The structure every member of one program has in common (the fields of `Personalized`).
COMMON = ("model", "cohort", "batch_size", "client_group", "cohort_groups", "devices",
          "eval_clients")


@struct.dataclass
class Member:
  """Which algorithm of the family runs, as traced values. shared, trained: bool [] per
  parameter path: averaged by the server; trained in the local epochs (FedRep: the body
  only). head_phase: bool []: FedRep's order (its key split in two, its head trained alone
  first); head_epochs, local_epochs: int32 [], the epochs of the head phase and of the
  local training. (The fine-tuning epochs are the option `hparams.FT_EPOCHS`.)"""
  shared: dict
  trained: dict
  head_phase: jax.Array
  head_epochs: jax.Array
  local_epochs: jax.Array


@struct.dataclass
class FamilyHparams(NNHparams):
  """`NNHparams` with the `Member` that a `Family` runs."""
  member: Member = None


@dataclasses.dataclass(frozen=True)
class Family(Personalized):
  """The family's program (see the module docstring). local_epochs, head_epochs and
  ft_epochs are the most epochs any member runs in each phase (0: no member has that
  phase); its hparams must be `FamilyHparams`, with the option FT_EPOCHS where ft_epochs
  > 0."""
  options = (conventions.FLAGS["average_untrained"], epochs_option(FT_EPOCHS))
  head_epochs: int = 0
  ft_epochs: int = 0
  name: str = "family"

  def initial_parts(self, flat):
    return flat, flat

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    member = hparams.member
    flat = jax.tree.map(jnp.where, member.shared, shared, personal)
    key_head, key_body = jax.random.split(key)
    key_body = jax.lax.cond(member.head_phase, lambda: key_body, lambda: key)
    if self.head_epochs:
      flat = self.head_trained(flat, x, y, count, key_head, hparams, self.head_epochs,
                               member.head_epochs)
    trained, loss = self.sgd(self.loss, flat, x, y, count, key_body, hparams,
                             self.local_epochs, active=member.local_epochs,
                             trainable=member.trained)
    return trained, trained, loss

  def shares_params(self, hparams):
    return jnp.any(jnp.stack(list(hparams.member.shared.values())))

  def eval_params(self, shared, personal, x, y, count, key, hparams):
    flat = jax.tree.map(jnp.where, hparams.member.shared, shared, personal)
    if not self.ft_epochs:
      return flat
    return self.head_trained(flat, x, y, count, key, hparams, self.ft_epochs,
                             hparams.options[FT_EPOCHS])


def member(algorithm: Personalized, flat: dict) -> Member | None:
  """The `Member` of `algorithm` for a model whose params (or their shapes) are `flat`
  (path -> leaf); None for an algorithm outside the family (MEMBERS)."""
  kind = type(algorithm)
  if kind not in MEMBERS:
    return None
  shared = {p: np.bool_(label == params_lib.SHARED)
            for p, label in algorithm.labels(flat).items()}
  is_fedrep = kind is FedRep
  return jax.device_put(Member(  # numpy scalars placed: no device program compiles
      shared=shared, trained=shared if is_fedrep else {p: np.bool_(True) for p in flat},
      head_phase=np.bool_(is_fedrep),
      head_epochs=np.int32(algorithm.head_epochs if is_fedrep else 0),
      local_epochs=np.int32(algorithm.local_epochs)))


def ft_epochs(algorithm: Personalized) -> int:
  """The epochs of head fine-tuning before testing of `algorithm` (0: none)."""
  return algorithm.ft_epochs if isinstance(algorithm, FedAvg) else 0


def with_epochs(hparams: NNHparams, option: str, epochs: int) -> NNHparams:
  """`hparams` with the option `option` (an epoch count) set to `epochs`."""
  return hparams.replace(options={**hparams.options, option: jax.device_put(np.int32(epochs))})


def program(algorithm: Personalized, hparams: NNHparams, peers, example) -> tuple:
  """(program, hparams) that run `algorithm` with its own numbers, shared with the other
  algorithms of `peers` (those a recipe runs) where they can share it:

  - the `Family` and the member's `FamilyHparams`, where `algorithm` and another of peers
    are members (MEMBERS) with the same COMMON structure;
  - else, where `algorithm`'s class reads an epoch count as a traced option
    (TRACED_EPOCHS) and a peer of its class differs from it only in that count (and its
    name): `algorithm` with the most of them of these peers (named after all of them),
    and that option set to its own count;
  - else `algorithm` and `hparams` unchanged.

  example: one input of the data (array or shape-dtype)."""
  sample = jax.ShapeDtypeStruct((1, *example.shape), example.dtype)
  flat = params_lib.flatten(jax.eval_shape(  # the key made inside: nothing compiles
      lambda x: algorithm.model.init(jax.random.key(0), x), sample)["params"])
  own = member(algorithm, flat)
  common = lambda a: tuple(getattr(a, f) for f in COMMON)
  group = [a for a in (algorithm, *peers)
           if type(a) in MEMBERS and common(a) == common(algorithm)]
  if own is not None and len({(type(a), a.name) for a in group}) > 1:
    family = Family(**dict(zip(COMMON, common(algorithm))),
                    local_epochs=max(a.local_epochs for a in group),
                    head_epochs=max([a.head_epochs for a in group if type(a) is FedRep] or [0]),
                    ft_epochs=max(map(ft_epochs, group)))
    fields = {f.name: getattr(hparams, f.name) for f in dataclasses.fields(NNHparams)}
    return family, with_epochs(FamilyHparams(**fields, member=own), FT_EPOCHS,
                               ft_epochs(algorithm))
  field = TRACED_EPOCHS.get(type(algorithm))
  bare = lambda a: dataclasses.replace(a, **{field: 0}, name="")
  variants = [a for a in (algorithm, *peers) if field is not None
              and type(a) is type(algorithm) and bare(a) == bare(algorithm)]
  if len({getattr(a, field) for a in variants}) > 1:
    shared_program = dataclasses.replace(
        algorithm, **{field: max(getattr(a, field) for a in variants)},
        name="+".join(sorted({a.name for a in variants})))
    return shared_program, with_epochs(hparams, field, getattr(algorithm, field))
  return algorithm, hparams
