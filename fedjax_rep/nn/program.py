"""`program`: the program that runs a neural algorithm among the others a recipe runs, so
that several of them compile once. The algorithms that answer `program_member` (the presets of
`partial.PartialSharing`: FedRep and FedRep*, FedPer, LG-FedAvg, FedAvg and FedAvg-FT,
local only) share its traced program; the variants of a class that reads an epoch count
also as a traced option (its `traced_epochs`: FedProx and SCAFFOLD with their "+ FT",
FLUTE with FLUTE*) share one where they differ only in that count.
"""

import dataclasses

import jax
import numpy as np

from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn.algorithm import Personalized
from fedjax_rep.nn.hparams import FT_EPOCHS, NNHparams
from fedjax_rep.nn.partial import Member, MemberHparams, SharedProgram

# The structure every member of one program has in common (the fields of `Personalized`).
COMMON = ("model", "cohort", "batch_size", "client_group", "cohort_groups", "devices",
          "eval_clients")


def member(algorithm: Personalized, flat: dict) -> Member | None:
  """The traced `Member` of `algorithm` for a model whose params (or their shapes) are
  `flat` (path -> leaf); None for an algorithm that is not a member (`program_member`)."""
  own = algorithm.program_member(flat)
  return None if own is None else own.placed()


def with_epochs(hparams: NNHparams, option: str, epochs: int) -> NNHparams:
  """`hparams` with the option `option` (an epoch count) set to `epochs`."""
  return hparams.replace(options={**hparams.options, option: jax.device_put(np.int32(epochs))})


def program(algorithm: Personalized, hparams: NNHparams, peers, example) -> tuple:
  """(program, hparams) that run `algorithm` with its own numbers, shared with the other
  algorithms of `peers` (those a recipe runs) where they can share it:

  - the traced `SharedProgram` and the member's `MemberHparams`, where `algorithm` and
    another of peers are members (`Personalized.program_member`) with the same COMMON
    structure;
  - else, where `algorithm`'s class reads an epoch count as a traced option
    (`traced_epochs`) and a peer of its class differs from it only in that count (and its
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
           if a.program_member(flat) is not None and common(a) == common(algorithm)]
  if own is not None and len({(type(a), a.name) for a in group}) > 1:
    shared_program = SharedProgram(
        **dict(zip(COMMON, common(algorithm))),
        local_epochs=max(a.local_epochs for a in group),
        head_epochs=max([a.head_epochs for a in group if a.head_phase] or [0]),
        ft_epochs=max(a.ft_epochs for a in group))
    fields = {f.name: getattr(hparams, f.name) for f in dataclasses.fields(NNHparams)}
    return shared_program, with_epochs(MemberHparams(**fields, member=own), FT_EPOCHS,
                                       algorithm.ft_epochs)
  field = algorithm.traced_epochs
  bare = lambda a: dataclasses.replace(a, **{field: 0}, name="")
  variants = [a for a in (algorithm, *peers) if field is not None
              and type(a) is type(algorithm) and bare(a) == bare(algorithm)]
  if len({getattr(a, field) for a in variants}) > 1:
    shared_program = dataclasses.replace(
        algorithm, **{field: max(getattr(a, field) for a in variants)},
        name="+".join(sorted({a.name for a in variants})))
    return shared_program, with_epochs(hparams, field, getattr(algorithm, field))
  return algorithm, hparams
