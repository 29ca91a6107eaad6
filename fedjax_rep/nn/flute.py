"""General FLUTE (Liu, Shen, Yang 2024, Algorithm 2 with the loss of Eq. 10) and FLUTE*:
shared body, personal heads pulled towards one neural-collapse pattern for all clients.

A sampled client i trains the server's body and its head (H_i = 'head/kernel' [F, C],
b_i = 'head/bias' [C]) on CE(H_i^T psi(x) + b_i, y) + l1 mean_x ||psi(x)||^2 +
l2 ||H_i||_F^2 + l3 NC_i(H_i) (Eq. 10; psi(x) [F] the body's output, the mean over the
minibatch's real rows, NC_i = `neural_collapse.nc_term` on the client's classes) for
`local_epochs`, then (FLUTE*) its head alone for `head_epochs` without the feature term.
The option `feature_sum` sums the feature term over the rows; the field `head_first` runs
the head epochs first, one optimiser state throughout. The penalties steer the gradient
only: the reported loss is the joint epochs' cross-entropy. The server averages the bodies
by sample counts, then steps `flute_server_lr` on the kernels H_i of the c clients that
trained, down R = (1/c) sum_i NC_i(H_i) (Alg. 2 line 22). Traced options, defaults the authors':
l3 = flute_nc = 0.25, l2 = flute_head_norm = 0.0025, l1 = flute_feature_norm = 0.0005,
flute_server_lr = 0.5. Departures from the authors' code: docs/papers/flute.md.
"""

import dataclasses

import jax
import jax.numpy as jnp
from optax import tree_utils as otu

from fedjax_rep.core import aggregate
from fedjax_rep.nn import conventions
from fedjax_rep.nn import neural_collapse as nc
from fedjax_rep.nn import train
from fedjax_rep.nn.algorithm import Personalized
from fedjax_rep.nn.hparams import HEAD_EPOCHS, Option, epochs_option

KERNEL = "head/kernel"
FEATURE_SUM = conventions.FLAG_OF["feature_penalty"]


@dataclasses.dataclass(frozen=True)
class Flute(Personalized):
  options = (conventions.FLAGS["average_untrained"], conventions.FLAGS["feature_sum"],
             epochs_option(HEAD_EPOCHS),
             Option("flute_nc", 0.25, help="FLUTE's weight lambda3 of the neural-collapse term"),
             Option("flute_head_norm", 0.0025, help="FLUTE's weight lambda2 of ||H||_F^2"),
             Option("flute_feature_norm", 0.0005,
                    help="FLUTE's weight lambda1 of the features' squared norm"),
             Option("flute_server_lr", 0.5,
                    help="FLUTE's server step on the cohort's heads' mean NC term"))
  traced_epochs = HEAD_EPOCHS
  head_epochs: int = 0
  head_first: bool = False
  name: str = "flute"

  def head_penalty(self, head: dict, classes: jax.Array, hparams) -> jax.Array:
    """l2 ||H||_F^2 + l3 NC(H) [] of a head ('head/...', H its kernel [F, C]) whose client
    has the classes [C] (bool); l2, l3: hparams' flute_head_norm, flute_nc."""
    kernel = head[KERNEL]
    return (self.option(hparams, "flute_head_norm") * jnp.sum(kernel * kernel)
            + self.option(hparams, "flute_nc") * nc.nc_term(kernel, classes))

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    classes = nc.class_mask(y, count, personal[KERNEL].shape[-1])
    key_joint, key_head = jax.random.split(key)
    feature_sum = hparams.options.get(FEATURE_SUM)
    tx = train.optimizer(hparams)

    def joint_loss(params, xb, yb, wb, k):
      body, head = params
      h = self.features(body, xb)
      rows = jnp.maximum(jnp.sum(wb), 1.0)
      if feature_sum is not None:
        rows = jnp.where(feature_sum > 0, 1.0, rows)
      features = jnp.sum(wb * jnp.sum(h * h, axis=-1)) / rows
      penalty = (self.option(hparams, "flute_feature_norm") * features
                 + self.head_penalty(head, classes, hparams))
      return (train.cross_entropy(self.head_logits(head, h, k), yb, wb)
              + train.gradient_only(penalty))

    def head_loss(p, hb, yb, wb, k):
      return (train.cross_entropy(self.head_logits(p, hb, k), yb, wb)
              + train.gradient_only(self.head_penalty(p, classes, hparams)))

    def head_trained(body, head):
      """(head, its optimiser state) after the head epochs on body's features."""
      start = tx.init(head)
      if not self.head_epochs:
        return head, start
      active = hparams.options.get(HEAD_EPOCHS)

      def run():
        trained, state, _ = train.sgd_epochs_from(
            head_loss, head, start, self.features(body, x), y, count, key_head, hparams,
            epochs=self.head_epochs, batch_size=self.batch_size, active=active)
        return trained, state

      return run() if active is None else jax.lax.cond(active > 0, run, lambda: (head, start))

    start = tx.init((shared, personal))
    if self.head_first:
      personal, head_state = head_trained(shared, personal)
      start = otu.tree_set(start, trace=(otu.tree_get(start, "trace")[0],
                                         otu.tree_get(head_state, "trace")))
    (body, head), _, loss = train.sgd_epochs_from(
        joint_loss, (shared, personal), start, x, y, count, key_joint, hparams,
        epochs=self.local_epochs, batch_size=self.batch_size)
    if not self.head_first:
      head, _ = head_trained(body, head)
    return body, head, loss

  def exchanged(self, shared, personal, hparams):
    """The head kernel H_i up and back down: the server's NC step moves the cohort's."""
    head = {KERNEL: personal[KERNEL]}
    return head, head, 1.0

  def nc_step(self, kernels: jax.Array, classes: jax.Array, trained: jax.Array,
              hparams) -> jax.Array:
    """The server's step: head kernels [c, F, C] of clients with classes [c, C] (bool) after
    one gradient step of size flute_server_lr (hparams' option) on R = the mean of
    `nc_term` over the clients where trained [c] (bool) is True; the others' kernels are
    returned unchanged."""
    def regulariser(k):
      return aggregate.weighted_mean(jax.vmap(nc.nc_term)(k, classes),
                                     trained.astype(k.dtype))

    stepped = kernels - self.option(hparams, "flute_server_lr") * jax.grad(regulariser)(kernels)
    return jnp.where(trained[:, None, None], stepped, kernels)

  def masked_round(self, state, key, data, hparams, clients, mask=None):
    """`Personalized.masked_round` (local training, bodies averaged), then `nc_step` on the
    heads of the clients that trained (clients [c] where mask [c] is True)."""
    state, metrics = super().masked_round(state, key, data, hparams, clients, mask)
    kernels = state.personal[KERNEL]
    classes = self.class_masks(data, clients, kernels.shape[-1])
    trained = jnp.ones(clients.shape, bool) if mask is None else mask
    stepped = self.nc_step(kernels[clients], classes, trained, hparams)
    return state.replace(personal={**state.personal,
                                   KERNEL: kernels.at[clients].set(stepped)}), metrics

  def class_masks(self, data, clients: jax.Array, classes: int) -> jax.Array:
    """The classes [c, classes] (bool) present in the training labels of clients `clients`
    [c]."""
    return data.map_clients(lambda _, x, y, count: nc.class_mask(y, count, classes), clients,
                            clients, self.client_group)

  def evaluate(self, state, data, hparams) -> dict:
    """`Personalized.evaluate` and the NC2 metrics of every client's head on the classes of
    its training data: global_nc2 and local_nc2 (`neural_collapse.nc2_metrics`)."""
    kernels = state.personal[KERNEL]
    classes = self.class_masks(data, jnp.arange(data.num_clients), kernels.shape[-1])
    return {**super().evaluate(state, data, hparams), **nc.nc2_metrics(kernels, classes)}
