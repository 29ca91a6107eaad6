"""The neural round: a cohort trains locally (one vmap over client groups), the server
averages the shared parameters, every client keeps its personal ones.

`Personalized` is the base every neural algorithm derives from. Its structure (static
fields) is the model, the cohort size, the epochs, the batch size and the client group
size; its hyperparameters (`NNHparams`) are traced. Subclasses choose

- `labels(flat_params)`: the label tree, which parameters are shared and which personal;
- `client_update(...)`: a client's local training (default: `local_epochs` of SGD on all
  its parameters at once);
- `eval_params(...)`: what a client evaluates with (default: its shared + personal ones);
- `initial_parts(flat)`: the state's (shared, one client's personal) parts of the initial
  model (default: the model split by `labels`; Ditto and APFL keep a second copy, SCAFFOLD
  adds control variates);
- `server_update(...)`: how the server combines what the cohort sent (default: the
  count-weighted mean).
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import struct
from optax import tree_utils as otu

from fedjax_rep.core import aggregate
from fedjax_rep.core import cohort as cohort_lib
from fedjax_rep.core import tree
from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import train
from fedjax_rep.nn.hparams import NNHparams


@struct.dataclass
class NNState:
  """shared: flat params kept by the server (once); personal: flat params kept by the
  clients, each [n, ...] (sampled or not, a client keeps its own across rounds);
  eval_key: uint32 key data of the randomness of evaluation (fine-tuning shuffles)."""
  shared: dict
  personal: dict
  eval_key: jax.Array


@dataclasses.dataclass(frozen=True)
class Personalized:
  """Base of the neural algorithms (see the module docstring).

  model: a `models.Classifier` (params {'body', 'head'}); cohort: clients per round;
  local_epochs: epochs of local training (FedRep: of the body, after its head epochs);
  batch_size: minibatch size; client_group: clients trained together
  in one vmap (the groups run one after another; None: the whole cohort at once).
  """
  model: nn.Module
  cohort: int
  local_epochs: int = 1
  batch_size: int = 10
  client_group: int | None = 10
  name: str = "personalized"

  def labels(self, flat: dict) -> dict:
    """The label tree: FedRep and FedPer share the body and personalise the head."""
    return params_lib.head_personal(flat)

  # -- model pieces ----------------------------------------------------------------------
  def logits(self, flat: dict, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
    """Logits [b, C] of inputs x [b, ...]; dropout on where `key` is given (training)."""
    return self.model.apply({"params": params_lib.unflatten(flat)}, x, train=key is not None,
                            rngs=None if key is None else {"dropout": key})

  def features(self, body: dict, x: jax.Array) -> jax.Array:
    """The body's output [b, F] (deterministic) of inputs x [b, ...]; body: 'body/...'."""
    return self.model.apply({"params": params_lib.unflatten(body)}, x,
                            method=self.model.features)

  def head_logits(self, head: dict, h: jax.Array, key: jax.Array | None = None) -> jax.Array:
    """Logits [b, C] of the head ('head/...') on features h [b, F]."""
    return self.model.apply({"params": params_lib.unflatten(head)}, h, train=key is not None,
                            rngs=None if key is None else {"dropout": key},
                            method=self.model.logits)

  def loss(self, flat, x, y, weights, key):
    """Weighted cross-entropy of the whole model (a minibatch loss for `train.sgd_epochs`)."""
    return train.cross_entropy(self.logits(flat, x, key), y, weights)

  # -- local training ----------------------------------------------------------------------
  def sgd(self, loss_fn, params, x, y, count, key, hparams, epochs: int):
    """`train.sgd_epochs` with this algorithm's batch size."""
    return train.sgd_epochs(loss_fn, params, x, y, count, key, hparams, epochs=epochs,
                            batch_size=self.batch_size)

  def train_head(self, body: dict, head: dict, x, y, count, key, hparams, epochs: int):
    """(head, mean loss) after `epochs` of SGD on the head alone. The body is frozen, so
    its features are computed once (one forward pass, not one per epoch)."""
    h = self.features(body, x)
    loss = lambda p, hb, yb, wb, k: train.cross_entropy(self.head_logits(p, hb, k), yb, wb)
    return self.sgd(loss, head, h, y, count, key, hparams, epochs)

  def client_update(self, shared: dict, personal: dict, x, y, count, key, hparams):
    """One client's local training: (its new shared params, new personal params, mean
    loss). `shared` is the server's (unbatched in the cohort's vmap), `personal` the
    client's; x [m, ...], y [m], count real rows. Default: `local_epochs` of SGD on all
    parameters at once (FedPer, LG-FedAvg, FedAvg, local only)."""
    flat = params_lib.merge(shared, personal)
    trained, loss = self.sgd(self.loss, flat, x, y, count, key, hparams, self.local_epochs)
    return (*params_lib.split(trained, self.labels(trained)), loss)

  # -- the algorithm ---------------------------------------------------------------------
  def initial_parts(self, flat: dict) -> tuple[dict, dict]:
    """(shared, one client's personal) parts of the state for initial model params `flat`."""
    return params_lib.split(flat, self.labels(flat))

  def init(self, key, data, hparams: NNHparams) -> NNState:
    """The model's initial params (one draw: every client starts from the same model)."""
    del hparams
    key_model, key_eval = jax.random.split(key)
    sample = jnp.zeros((1, *data.x.shape[2:]), data.x.dtype)
    flat = params_lib.flatten(self.model.init(key_model, sample)["params"])
    shared, personal = self.initial_parts(flat)
    personal = jax.tree.map(lambda p: jnp.broadcast_to(p, (data.num_clients, *p.shape)),
                            personal)
    return NNState(shared=shared, personal=personal, eval_key=jax.random.key_data(key_eval))

  def round(self, state: NNState, key, data, hparams: NNHparams):
    key_cohort, key_clients = jax.random.split(key)
    clients = cohort_lib.sample_cohort(key_cohort, data.num_clients, self.cohort)
    return self.masked_round(state, key_clients, data, hparams, clients)

  def masked_round(self, state: NNState, key, data, hparams: NNHparams, clients, mask=None):
    """One round of clients `clients` [c] where `mask` [c] (bool; None: all) is True: they
    train (client i with key fold_in(key, i)), the server averages their shared params
    weighted by their sample counts, and they keep their new personal params; masked and
    unsampled clients keep theirs. Metrics: train_loss (count-weighted mean over the
    cohort of each client's mean minibatch loss)."""
    counts = data.sample_counts(clients)
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, clients)
    old_personal = tree.gather(state.personal, clients)

    def client(args):  # fetches its own data: the cohort's is never copied out as a whole
      personal, client_id, client_key = args
      x, y, count = jax.tree.map(lambda a: a[0], data.batch(key, client_id[None]))
      return self.client_update(state.shared, personal, x, y, count, client_key, hparams)

    shared, personal, losses = train.client_map(
        client, (old_personal, clients, keys), self.client_group)
    weights = counts if mask is None else jnp.where(mask, counts, 0.0)
    shared = self.server_update(state.shared, shared, weights, data.num_clients)
    if mask is not None:
      personal = jax.tree.map(
          lambda new, old: jnp.where(mask.reshape(-1, *[1] * (new.ndim - 1)), new, old),
          personal, old_personal)
    state = state.replace(shared=shared, personal=tree.scatter(state.personal, clients, personal))
    return state, {"train_loss": aggregate.weighted_mean(losses, weights)}

  def server_update(self, shared: dict, sent: dict, weights: jax.Array, num_clients: int):
    """The server's new shared params from what the cohort sent (`sent`: each client's
    `client_update` shared output, leaves [c, ...]) with weights [c] (sample counts, 0
    for masked clients) out of num_clients: the weighted mean (unchanged if no weight)."""
    del num_clients
    sums, total = aggregate.weighted_sum(sent, weights)
    return otu.tree_where(total > 0, aggregate.mean(sums, total), shared)

  def eval_params(self, shared: dict, personal: dict, x, y, count, key, hparams) -> dict:
    """The flat params a client is tested with (default: shared + its personal ones)."""
    del x, y, count, key, hparams
    return params_lib.merge(shared, personal)

  def evaluate(self, state: NNState, data, hparams: NNHparams) -> dict:
    """Every client's accuracy on its own test set with its own params (`eval_params`):
    test_accuracy (the mean over clients) and test_accuracy_std (their std)."""
    clients = jnp.arange(data.num_clients)
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
        jax.random.wrap_key_data(state.eval_key), clients)

    def client(args):
      personal, x, y, count, key, x_test, y_test, test_count = args
      flat = self.eval_params(state.shared, personal, x, y, count, key, hparams)
      return train.accuracy(self.logits(flat, x_test), y_test, test_count)

    accuracies = train.client_map(client, (state.personal, data.x, data.y, data.counts, keys,
                                           data.x_test, data.y_test, data.test_counts),
                                  self.client_group)
    return accuracy_metrics(accuracies)

  def new_clients(self, state: NNState, data, hparams: NNHparams, key, epochs: int) -> dict:
    """Accuracy of new clients (`data`: their own train and test sets) that reuse the
    learned body (the server's) and fit only a head, from zero, by `epochs` epochs of SGD
    on their training data (FedRep Fig. 4's question, for neural nets)."""
    body = {p: v for p, v in state.shared.items() if p.startswith("body/")}
    head = {p: jnp.zeros(v.shape[1:] if p in state.personal else v.shape, v.dtype)
            for p, v in {**state.shared, **state.personal}.items() if p.startswith("head/")}
    if any(p.startswith("body/") for p in state.personal):
      raise ValueError(f"{self.name} keeps body parameters personal: there is no learned body "
                       f"for new clients to reuse")
    keys = jax.random.split(key, data.num_clients)

    def client(args):
      x, y, count, client_key, x_test, y_test, test_count = args
      new_head, _ = self.train_head(body, head, x, y, count, client_key, hparams, epochs)
      return train.accuracy(self.logits(params_lib.merge(body, new_head), x_test), y_test,
                            test_count)

    return accuracy_metrics(train.client_map(
        client, (data.x, data.y, data.counts, keys, data.x_test, data.y_test, data.test_counts),
        self.client_group))


def accuracy_metrics(accuracies: jax.Array) -> dict:
  """test_accuracy (mean over clients of accuracies [n]) and test_accuracy_std."""
  return {"test_accuracy": jnp.mean(accuracies), "test_accuracy_std": jnp.std(accuracies)}
