"""The neural algorithms in the registry (`core.registry`), and `make_algorithm`."""

import dataclasses

from fedjax_rep.core import registry
from fedjax_rep.nn import hparams as hparams_lib
from fedjax_rep.nn.apfl import APFL
from fedjax_rep.nn.ditto import Ditto
from fedjax_rep.nn.fed_mtl import FedMTL
from fedjax_rep.nn.fedavg import FedAvg
from fedjax_rep.nn.fedavg_steps import FedAvgSteps
from fedjax_rep.nn.fedbabu import FedBABU
from fedjax_rep.nn.fedcp import FedCP
from fedjax_rep.nn.fedper import FedPer
from fedjax_rep.nn.fedprox import FedProx
from fedjax_rep.nn.fedrep import FedRep
from fedjax_rep.nn.fedrod import FedRoD
from fedjax_rep.nn.flute import Flute
from fedjax_rep.nn.l2gd import L2GD
from fedjax_rep.nn.lg_fedavg import LGFedAvg
from fedjax_rep.nn.local import Local
from fedjax_rep.nn.per_fedavg import PerFedAvg
from fedjax_rep.nn.scaffold import Scaffold

DEFAULT_FT_EPOCHS = 10  # FedRep's "+FT": each client fine-tunes the head for 10 epochs
STAR_HEAD_EPOCHS = 10  # FLUTE's FedRep* and FLUTE*: 10 head epochs per round (Sec. 7.2)


def _maker(cls, **fixed):
  """make(name, **structure) of `cls`: the structure fields `cls` has, then `fixed` (the
  fields of `partial.PartialSharing` that an algorithm does not use are fixed at 0)."""
  names = {f.name for f in dataclasses.fields(cls)}

  def make(name, **structure):
    return cls(**{**{k: v for k, v in structure.items() if k in names}, **fixed, "name": name})

  return make


CLASSES: dict[str, type] = {}  # the class registered under each name


def register(name: str, summary: str, cls, **fixed) -> registry.Entry:
  """Registers the neural algorithm class `cls` as `name`.

  `make_algorithm(name, ...)` then builds it with the structure fields `cls` has, then
  `fixed`; `fedjax-rep list` lists it with its `summary`; its declared options
  (`hparams.declared`) become options `fr.nn_hparams` and the recipes' --set accept.

  Args:
    name: the name it is built and listed by.
    summary: its one-line description.
    cls: a `Personalized` subclass.
    **fixed: structure fields set for this name (e.g. head_epochs=0), over
      `make_algorithm`'s.

  Returns:
    Its `core.registry.Entry`.

  Raises:
    ValueError: `name` is registered already, unless by the same class defined again
      outside the package (a plugin file or a notebook cell run again: same module, same
      class name), which replaces it.
  """
  previous = CLASSES.get(name)
  if previous is not None and not _same_user_class(previous, cls):
    raise ValueError(f"neural algorithm {name!r} is registered already (by "
                     f"{previous.__module__}.{previous.__qualname__}); register "
                     f"{cls.__qualname__} under another name")
  CLASSES[name] = cls
  hparams_lib.KNOWN.update(hparams_lib.declared(cls))
  return registry.register("neural", name, summary, _maker(cls, **fixed),
                           options=tuple(hparams_lib.declared(cls).values()))


def _same_user_class(previous: type, cls: type) -> bool:
  """Whether `cls` is `previous` defined again by the same user module (not the package's)."""
  return (previous.__module__, previous.__qualname__) == (cls.__module__, cls.__qualname__) \
      and not cls.__module__.startswith("fedjax_rep.")


def options() -> dict[str, hparams_lib.Option]:
  """{name: Option} of every option a registered neural algorithm declares
  (`hparams.KNOWN`)."""
  return dict(hparams_lib.KNOWN)


for _name, _summary, _cls, _fixed in [
    ("fedrep", "FedRep (Alg. 1): head epochs with the body frozen, then body epochs with the "
     "head frozen; the server averages bodies, heads stay personal", FedRep, dict(ft_epochs=0)),
    ("fedper", "FedPer: body and head trained together; the server averages bodies, heads "
     "stay personal", FedPer, dict(head_epochs=0, ft_epochs=0)),
    ("lg-fedavg", "LG-FedAvg: local body, global head (the last two layers are averaged)",
     LGFedAvg, dict(head_epochs=0, ft_epochs=0)),
    ("fedavg", "FedAvg: one global model, local epochs, count-weighted average",
     FedAvg, dict(head_epochs=0, ft_epochs=0)),
    ("fedavg-ft", "FedAvg + FT: FedAvg, then each client fine-tunes the head (10 epochs) "
     "before it is tested", FedAvg, dict(head_epochs=0)),
    ("local", "local only: every client trains its own model, no communication",
     Local, dict(head_epochs=0, ft_epochs=0)),
    ("fedprox", "FedProx: FedAvg with a proximal term (prox_mu/2)||w - w_global||^2",
     FedProx, dict(ft_epochs=0)),
    ("fedprox-ft", "FedProx + FT: FedProx, then each client fine-tunes the head before it is "
     "tested", FedProx, {}),
    ("scaffold", "SCAFFOLD: FedAvg with server and client control variates correcting "
     "client drift", Scaffold, dict(ft_epochs=0)),
    ("scaffold-ft", "SCAFFOLD + FT: SCAFFOLD, then each client fine-tunes the head before it "
     "is tested", Scaffold, {}),
    ("ditto", "Ditto: FedAvg global model plus personal models pulled to it by "
     "(ditto_lambda/2)||v - w||^2", Ditto, {}),
    ("apfl", "APFL: personal model apfl_alpha*v + (1-apfl_alpha)*w of a local and the "
     "global model", APFL, {}),
    ("per-fedavg", "Per-FedAvg (first-order MAML): a global model trained to do well after "
     "one local step of maml_inner_lr", PerFedAvg, {}),
    ("l2gd", "L2GD: loopless local GD on personal models; averaging rounds with "
     "probability l2gd_p, penalty l2gd_lambda", L2GD, {}),
    ("fedavg-steps", "FedAvg with local_steps minibatch SGD steps per round (not epochs): "
     "one global model", FedAvgSteps, dict(ft_epochs=0)),
    ("d-sgd", "D-SGD (mini-batch SGD): FedAvg with one local step per round",
     FedAvgSteps, dict(ft_epochs=0, local_steps=1)),
    ("fedrod", "FedRoD: a generic model trained on the balanced softmax and averaged, plus a "
     "personal head added to its logits", FedRoD, {}),
    ("fedbabu", "FedBABU: FedAvg on the body under a frozen random head; each client "
     "fine-tunes the model (ft_epochs) before it is tested", FedBABU, {}),
    ("fedrep-star", "FedRep* (FLUTE Sec. 7.2): FedRep with 10 head epochs per round",
     FedRep, dict(head_epochs=STAR_HEAD_EPOCHS, ft_epochs=0)),
    ("flute", "FLUTE (Alg. 2, Eq. 10): body and head trained together on CE + feature, head "
     "and neural-collapse penalties; the server averages bodies, then one NC step on the "
     "cohort's heads", Flute, dict(head_epochs=0)),
    ("flute-star", "FLUTE*: FLUTE's joint epochs, then 10 epochs of the head alone (body "
     "frozen)", Flute, dict(head_epochs=STAR_HEAD_EPOCHS)),
    ("fed-mtl", "Fed-MTL: personal models trained on CE + lambda (||W||^2 + tr(W Omega W^T)) "
     "of the cohort's models W; nothing averaged", FedMTL, {}),
    ("fedcp", "FedCP: a conditional policy splits each sample's features between a "
     "personal and a global head; body, global head and policy averaged", FedCP, {}),
]:
  register(_name, _summary, _cls, **_fixed)

ALGORITHMS = registry.ALGORITHMS["neural"]


def make_algorithm(name: str, *, model, cohort: int, local_epochs: int = 1,
                   head_epochs: int = 10, batch_size: int = 10, client_group: int | None = 10,
                   ft_epochs: int = DEFAULT_FT_EPOCHS, local_steps: int = 1,
                   cohort_groups: int | None = None, devices: int | None = None,
                   head_first: bool = False, eval_clients: str = "all"):
  """The neural algorithm registered as `name`, with its structure (static fields).

  The structure's fields are those of `algorithm.Personalized`; each algorithm takes the ones
  it has. Its numbers (the baselines' prox_mu, ditto_lambda, ...) are traced options, in
  the hparams (`hparams.hparams`).

  Args:
    name: a key of ALGORITHMS.
    model: the model (`models.make_model`).
    cohort: clients per round.
    local_epochs: epochs of local training (FedRep: of the body, after `head_epochs`).
    head_epochs: FedRep's epochs of the head, before the body's.
    batch_size: the minibatch size.
    client_group: clients trained together in one vmap (None: the whole cohort at once).
    ft_epochs: the "+ft" variants' epochs of head fine-tuning before testing.
    local_steps: fedavg-steps' SGD steps per round (instead of epochs).
    cohort_groups: draw the cohort over this many contiguous groups of clients.
    devices: shard the client axis over this many devices (None: unsharded).
    head_first: FLUTE*'s head epochs before its joint ones, one optimiser throughout (the
      authors' code; `conventions`' flute_star_order).
    eval_clients: whom evaluate tests: "all" clients (FedRep's code) or the last round's
      "cohort".

  Returns:
    The algorithm (a frozen dataclass, a `Personalized`).

  Raises:
    ValueError: an unknown name.
  """
  return registry.make(name, "neural", model=model, cohort=cohort, local_epochs=local_epochs,
                       head_epochs=head_epochs, batch_size=batch_size,
                       client_group=client_group, ft_epochs=ft_epochs,
                       local_steps=local_steps, cohort_groups=cohort_groups,
                       devices=devices, head_first=head_first, eval_clients=eval_clients)
