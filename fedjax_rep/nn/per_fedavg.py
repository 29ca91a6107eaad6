"""Per-FedAvg (Fallah et al. 2020), first-order (FO-MAML): a global model trained to
perform well after one local gradient step.

Each step of a sampled client's `local_epochs` splits its minibatch into halves D and D'
(the first and last batch_size // 2 positions): w' = w - maml_inner_lr * grad f(w; D)
(maml_inner_lr: the traced option, default 0.01), then w moves (SGD with momentum and
weight decay) along grad f(w'; D') (the first-order approximation: no Hessian term). A
step whose D' holds no real sample has gradient 0. The server averages as FedAvg does. A
client is tested with the global model after one full-batch gradient step of size
maml_inner_lr on its training data. The reported loss is f(w'; D').
"""

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn.algorithm import Personalized
from fedjax_rep.nn.hparams import Option


@dataclasses.dataclass(frozen=True)
class PerFedAvg(Personalized):
  options = (Option("maml_inner_lr", 0.01, open=True,
                     help="Per-FedAvg's inner (adaptation) step size"),)
  name: str = "per-fedavg"

  def __post_init__(self):
    if self.batch_size < 2:
      raise ValueError(f"per-fedavg needs batch_size >= 2 (its minibatches are split in "
                       f"two halves), got {self.batch_size}")

  def labels(self, flat):
    return params_lib.all_shared(flat)

  def adapted(self, params, x, y, weights, key, hparams):
    """params - maml_inner_lr * grad f(params; x, y, weights), the gradient held fixed
    (maml_inner_lr: hparams' option)."""
    grads = jax.lax.stop_gradient(jax.grad(self.loss)(params, x, y, weights, key))
    inner_lr = self.option(hparams, "maml_inner_lr")
    return jax.tree.map(lambda p, g: p - inner_lr * g, params, grads)

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    half = self.batch_size // 2

    def loss(params, xb, yb, wb, k):
      key_inner, key_outer = jax.random.split(k)
      inner = self.adapted(params, xb[:half], yb[:half], wb[:half], key_inner, hparams)
      return self.loss(inner, xb[half:], yb[half:], wb[half:], key_outer)

    trained, mean_loss = self.sgd(loss, shared, x, y, count, key, hparams, self.local_epochs)
    return trained, personal, mean_loss

  def eval_params(self, shared, personal, x, y, count, key, hparams):
    real = (jnp.arange(x.shape[0]) < count).astype(jnp.float32)
    return self.adapted(shared, x, y, real, None, hparams)
