"""Frozen dataclasses that are JAX pytrees: flax.struct's `dataclass` and static fields,
built on jax.tree_util.register_dataclass, so that the linear half and the command line do
not import flax, a sizeable part of a short run's start-up (see docs/benchmarks.md)."""

import dataclasses

import jax


def dataclass(cls):
  """`cls` as a frozen dataclass registered as a pytree, with `.replace(**changes)` (a copy
  with those fields changed). Its fields are children, except `static_field`s, which are
  part of the tree's structure (jit traces again when they change)."""
  cls = dataclasses.dataclass(frozen=True)(cls)
  cls.replace = dataclasses.replace
  return jax.tree_util.register_dataclass(cls)


def static_field(**kwargs):
  """A field that is pytree structure, not a child (hashable: e.g. an int or a str)."""
  return dataclasses.field(metadata={"static": True}, **kwargs)
