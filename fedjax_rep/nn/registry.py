"""The neural algorithms in the registry (`core.registry`), and `make_algorithm`."""

import dataclasses

from fedjax_rep.core import registry
from fedjax_rep.nn.fedavg import FedAvg
from fedjax_rep.nn.fedper import FedPer
from fedjax_rep.nn.fedrep import FedRep
from fedjax_rep.nn.lg_fedavg import LGFedAvg
from fedjax_rep.nn.local import Local

FT_EPOCHS = 10  # FedRep's "+FT": each client fine-tunes the head for 10 epochs


def _maker(cls, **fixed):
  """make(name, **structure) of `cls`: the structure fields `cls` has, then `fixed`."""
  names = {f.name for f in dataclasses.fields(cls)}

  def make(name, **structure):
    return cls(**{**{k: v for k, v in structure.items() if k in names}, **fixed, "name": name})

  return make


for _name, _summary, _make in [
    ("fedrep", "FedRep (Alg. 1): head epochs with the body frozen, then body epochs with the "
     "head frozen; the server averages bodies, heads stay personal", _maker(FedRep)),
    ("fedper", "FedPer: body and head trained together; the server averages bodies, heads "
     "stay personal", _maker(FedPer)),
    ("lg-fedavg", "LG-FedAvg: local body, global head (the last two layers are averaged)",
     _maker(LGFedAvg)),
    ("fedavg", "FedAvg: one global model, local epochs, count-weighted average",
     _maker(FedAvg, ft_epochs=0)),
    ("fedavg-ft", "FedAvg + FT: FedAvg, then each client fine-tunes the head (10 epochs) "
     "before it is tested", _maker(FedAvg)),
    ("local", "local only: every client trains its own model, no communication",
     _maker(Local)),
]:
  registry.register("neural", _name, _summary, _make)

ALGORITHMS = registry.ALGORITHMS["neural"]


def make_algorithm(name: str, *, model, cohort: int, local_epochs: int = 1,
                   head_epochs: int = 10, batch_size: int = 10, client_group: int | None = 10,
                   ft_epochs: int = FT_EPOCHS):
  """The neural algorithm registered as `name` ('fedrep', 'fedper', 'lg-fedavg', 'fedavg',
  'fedavg-ft', 'local') for `model` (`models.make_model`), with its structure: clients per
  round, epochs (FedRep: `head_epochs` of the head, then `local_epochs` of the body;
  FedAvg-FT: `ft_epochs` of head fine-tuning before testing), minibatch size and client
  group size."""
  return registry.make(name, "neural", model=model, cohort=cohort, local_epochs=local_epochs,
                       head_epochs=head_epochs, batch_size=batch_size,
                       client_group=client_group, ft_epochs=ft_epochs)
