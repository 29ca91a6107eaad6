"""Partial sharing: one algorithm that FedRep, FedPer, LG-FedAvg, FedAvg (± FT) and local
only are settings of. Static fields say which parameters the server averages (`sharing`),
whether a client first trains its head alone, body frozen, then only its body
(`head_phase`, FedRep's order), the epochs of each phase and the fine-tuning of the head
before testing (`ft_epochs`).

Static (traced=False, a preset run alone): the choices are Python constants, so the
program is that algorithm's own; the state keeps the shared leaves on the server, the
personal ones on the clients. Traced (traced=True, the program several presets share,
`program.program`): the same code reads the choices from the hparams (`Member`, in
`MemberHparams`), and the state keeps the whole model twice, on the server (of which the
member's shared leaves are used) and on every client (the others): a sampled client sends
all its leaves, the server averages all of them and each client keeps all of its own. The
numbers are the member's own algorithm's (to float32 round-off: the programs differ).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core import struct
from fedjax_rep.nn import evaluation
from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn.algorithm import Personalized
from fedjax_rep.nn import conventions
from fedjax_rep.nn.hparams import FT_EPOCHS, NNHparams, epochs_option

# The values of `sharing`: the server averages the body (the head personal), everything,
# nothing, or the last `shared_layers` layers (`params`' label rules).
SHARING = ("body", "all", "none", "last-layers")


@struct.dataclass
class Member:
  """The choices of a `PartialSharing`: Python values (static) or traced ones (in
  `MemberHparams`). shared, trained: a bool per parameter path: averaged by the server;
  trained in the local epochs (FedRep: the body only). head_phase: FedRep's order (its key
  split in two, its head trained alone first); head_epochs, local_epochs: the epochs of the
  head phase and of the local training. (The fine-tuning epochs are the option
  `hparams.FT_EPOCHS`.)"""
  shared: dict
  trained: dict
  head_phase: jax.Array
  head_epochs: jax.Array
  local_epochs: jax.Array

  def placed(self) -> "Member":
    """These (Python) choices as traced values: numpy scalars placed on the device (no
    device program compiles)."""
    return jax.device_put(Member(
        shared={p: np.bool_(v) for p, v in self.shared.items()},
        trained={p: np.bool_(v) for p, v in self.trained.items()},
        head_phase=np.bool_(self.head_phase), head_epochs=np.int32(self.head_epochs),
        local_epochs=np.int32(self.local_epochs)))


@struct.dataclass
class MemberHparams(NNHparams):
  """`NNHparams` with the `Member` that a traced `PartialSharing` runs."""
  member: Member = None


def select(cond, a, b):
  """a where cond else b (pytrees of one structure): Python's choice where cond is a Python
  bool, `jnp.where` leaf by leaf where it is traced."""
  if isinstance(cond, bool):
    return a if cond else b
  return jax.tree.map(lambda u, v: jnp.where(cond, u, v), a, b)


def active_epochs(epochs):
  """`train.sgd_epochs`' `active` of an epoch count: None (all) where it is a Python int."""
  return None if isinstance(epochs, int) else epochs


@dataclasses.dataclass(frozen=True)
class PartialSharing(Personalized):
  """Local SGD; the server averages the leaves that `sharing` (one of SHARING) labels
  shared. head_phase: each client first trains its head alone for `head_epochs` (body
  frozen), then its body for `local_epochs` (head frozen); else all its parameters for
  `local_epochs`. ft_epochs: epochs of fine-tuning of the head before testing (0: none;
  the traced option FT_EPOCHS, where present, sets how many of them run). traced: the
  program shared by several settings (the module docstring): its epoch fields are the
  most any of them runs, its hparams `MemberHparams` (with the option FT_EPOCHS where
  ft_epochs > 0). The option average_untrained applies to the settings that declare it
  (FedRep, FedPer, LG-FedAvg) and to the traced program (`SharedProgram`)."""
  options = (epochs_option(FT_EPOCHS),)
  sharing: str = "body"
  shared_layers: int = 2
  head_phase: bool = False
  head_epochs: int = 0
  ft_epochs: int = 0
  traced: bool = False
  name: str = "partial-sharing"

  def labels(self, flat):
    rules = {"body": params_lib.head_personal, "all": params_lib.all_shared,
             "none": params_lib.all_personal,
             "last-layers": params_lib.last_layers_shared(self.shared_layers)}
    if self.sharing not in rules:
      raise ValueError(f"sharing={self.sharing!r} must be one of {SHARING}")
    return rules[self.sharing](flat)

  def program_member(self, flat: dict) -> Member | None:
    """This setting's choices (`member`) where its class runs `PartialSharing`'s own code (a
    preset: its classes below `PartialSharing` define no method), so the traced program
    (`program.program`) can run it; None for a subclass that changes a method."""
    below = type(self).__mro__[:type(self).__mro__.index(PartialSharing)]
    changed = any(callable(value) for cls in below for name, value in vars(cls).items()
                  if not name.startswith("__"))
    return None if changed else self.member(flat)

  def member(self, flat: dict) -> Member:
    """This setting's choices (Python values) for params `flat` (or their shapes)."""
    shared = {p: label == params_lib.SHARED for p, label in self.labels(flat).items()}
    return Member(shared=shared,
                  trained=shared if self.head_phase else {p: True for p in flat},
                  head_phase=bool(self.head_phase),
                  head_epochs=self.head_epochs if self.head_phase else 0,
                  local_epochs=self.local_epochs)

  def choices(self, flat: dict, hparams) -> Member:
    """The `Member` that runs: traced (hparams') or this setting's own."""
    return hparams.member if self.traced else self.member(flat)

  def kept(self, flat: dict, shared: dict, on_server: bool) -> dict:
    """The leaves of `flat` that the state keeps on the server (on_server) or the clients:
    those where `shared` is on_server; traced, all of them."""
    return flat if self.traced else {p: v for p, v in flat.items() if shared[p] == on_server}

  def model_params(self, shared: dict, personal: dict, member: Member) -> dict:
    """A client's model: the server's shared leaves, its own personal ones."""
    return {p: select(s, shared.get(p), personal.get(p)) for p, s in member.shared.items()}

  def initial_parts(self, flat):
    shared = self.member(flat).shared
    return self.kept(flat, shared, True), self.kept(flat, shared, False)

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    member = self.choices(params_lib.merge(shared, personal), hparams)
    flat = self.model_params(shared, personal, member)
    key_head, key_body = jax.random.split(key)
    key_body = select(member.head_phase, key_body, key)
    if self.head_epochs and (self.traced or self.head_phase):
      flat = self.head_trained(flat, x, y, count, key_head, hparams, self.head_epochs,
                               active_epochs(member.head_epochs))
    trained, loss = self.train_part(flat, member.trained, x, y, count, key_body, hparams,
                                    self.local_epochs, active_epochs(member.local_epochs))
    return (self.kept(trained, member.shared, True), self.kept(trained, member.shared, False),
            loss)

  def train_part(self, flat, trainable, x, y, count, key, hparams, epochs, active):
    """(flat with its `trainable` leaves trained by `epochs` of SGD on the model's loss, the
    others frozen; the mean loss). Static, SGD runs over the trainable leaves alone, the
    loss closing over the frozen ones; traced, over all, `trainable` keeping the others."""
    if self.traced:
      return self.sgd(self.loss, flat, x, y, count, key, hparams, epochs, active=active,
                      trainable=trainable)
    frozen = {p: v for p, v in flat.items() if not trainable[p]}

    def loss(part, xb, yb, wb, k):
      return self.loss(params_lib.merge(part, frozen), xb, yb, wb, k)

    part = {p: v for p, v in flat.items() if trainable[p]}
    trained, mean_loss = self.sgd(loss, part, x, y, count, key, hparams, epochs)
    return params_lib.merge(trained, frozen), mean_loss

  def shared_leaves(self, hparams):
    """Traced, the member's shared leaves (the program sends every leaf); else None."""
    return hparams.member.shared if self.traced else None

  def shares_params(self, hparams):
    if not self.traced:
      return True
    return jnp.any(jnp.stack(list(hparams.member.shared.values())))

  def eval_params(self, shared, personal, x, y, count, key, hparams):
    member = self.choices(params_lib.merge(shared, personal), hparams)
    flat = self.model_params(shared, personal, member)
    return self.fine_tuned(flat, x, y, count, key, hparams, self.ft_epochs)

  def new_clients(self, state, data, hparams, key, epochs: int) -> dict:
    """New clients adapt what the setting personalises: where the server averages the whole
    body (FedRep, FedPer, FedAvg with or without FT), a head from zero on the frozen body
    (`head_probe`); where a client keeps body leaves (LG-FedAvg, local only), its personal
    leaves, drawn afresh from the model's initialisation (heads from zero), trained for
    `epochs` epochs with the shared ones (the server's) frozen (`personal_adapted`).
    Traced, each member's own choice (both computed, one selected)."""
    one = params_lib.merge(state.shared, {p: v[0] for p, v in state.personal.items()})
    member = self.choices(one, hparams)
    body = [p for p in member.shared if p.startswith("body/")]
    body_personal = any(not member.shared[p] for p in body) if not self.traced else (
        ~jnp.all(jnp.stack([member.shared[p] for p in body])))
    if body_personal is False:
      return super().new_clients(state, data, hparams, key, epochs)
    personal = self.personal_adapted(state, member, hparams, epochs)
    if body_personal is True:
      return evaluation.new_clients(self, personal, data, key)
    probe = self.head_probe(state, hparams, epochs)
    return evaluation.new_clients(self, lambda *args: select(body_personal, personal(*args),
                                                             probe(*args)), data, key)

  def personal_adapted(self, state, member: Member, hparams, epochs: int):
    """adapted(key, x, y, count) -> flat params (`evaluation.new_clients`): the server's
    shared leaves (frozen) and the member's personal ones, from a fresh draw of the model's
    initialisation (heads from zero), trained for `epochs` epochs on the model's loss."""
    def adapted(key, x, y, count):
      key_init, key_train = jax.random.split(key)
      fresh = params_lib.flatten(self.model.init(key_init, x[:1])["params"])
      start = {p: select(member.shared[p], state.shared.get(p, v),
                         jnp.zeros_like(v) if p.startswith("head/") else v)
               for p, v in fresh.items()}
      trainable = {p: ~s if self.traced else not s for p, s in member.shared.items()}
      return self.train_part(start, trainable, x, y, count, key_train, hparams, epochs,
                             None)[0]

    return adapted


@dataclasses.dataclass(frozen=True)
class SharedProgram(PartialSharing):
  """The traced `PartialSharing` that several settings share (`program.program`); it takes
  the option average_untrained, which its FedRep, FedPer and LG-FedAvg members read."""
  options = (conventions.FLAGS["average_untrained"],)
  traced: bool = True
  name: str = "family"
