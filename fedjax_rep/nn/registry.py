"""The neural algorithms in the registry (`core.registry`), and `make_algorithm`."""

from fedjax_rep.core import registry
from fedjax_rep.nn.fedavg import FedAvg
from fedjax_rep.nn.fedper import FedPer
from fedjax_rep.nn.fedrep import FedRep
from fedjax_rep.nn.lg_fedavg import LGFedAvg
from fedjax_rep.nn.local import Local

FT_EPOCHS = 10  # FedRep's "+FT": each client fine-tunes the head for 10 epochs


def _maker(cls, **fixed):
  def make(name, *, model, cohort, local_epochs=1, head_epochs=10, batch_size=10,
           client_group=10, ft_epochs=FT_EPOCHS):
    structure = dict(model=model, cohort=cohort, local_epochs=local_epochs,
                     batch_size=batch_size, client_group=client_group, name=name)
    if cls is FedRep:
      structure["head_epochs"] = head_epochs
    if name == "fedavg-ft":
      structure["ft_epochs"] = ft_epochs
    return cls(**structure, **fixed)
  return make


for _name, _summary, _cls in [
    ("fedrep", "FedRep (Alg. 1): head epochs with the body frozen, then body epochs with the "
     "head frozen; the server averages bodies, heads stay personal", FedRep),
    ("fedper", "FedPer: body and head trained together; the server averages bodies, heads "
     "stay personal", FedPer),
    ("lg-fedavg", "LG-FedAvg: local body, global head (the last two layers are averaged)",
     LGFedAvg),
    ("fedavg", "FedAvg: one global model, local epochs, count-weighted average", FedAvg),
    ("fedavg-ft", "FedAvg + FT: FedAvg, then each client fine-tunes the head (10 epochs) "
     "before it is tested", FedAvg),
    ("local", "local only: every client trains its own model, no communication", Local),
]:
  registry.register("neural", _name, _summary, _maker(_cls))

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
