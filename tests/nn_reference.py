"""Independent numpy reference of the neural algorithms' rounds for an MLP, written plainly:
float64, a Python loop over clients, hand-written backprop, PyTorch-style SGD.

Params are flat dicts of numpy arrays named as the package names them: 'body/fc1/kernel',
'body/fc1/bias', ..., 'head/kernel', 'head/bias' (a Dense kernel is [in, out] and
y = x @ kernel + bias). The body is ReLU(dense) layers fc1, fc2, ...; the head is linear.

Randomness is an input: the shuffles come from the package's key derivation, replicated
here with jax.random calls (client i trains with fold_in(round_key, i); FedRep splits that
into (head key, body key); local training splits its key into one key per epoch, each
epoch key into (order key, step keys), and the epoch's order is `train.epoch_order`).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.nn import train

ALGORITHMS = ("fedrep", "fedper", "lg-fedavg", "fedavg", "local")


# -- the model -----------------------------------------------------------------------------
def body_layers(params: dict) -> list[str]:
  """Body layer names in network order ['body/fc1', 'body/fc2', ...]."""
  names = {p.rsplit("/", 1)[0] for p in params if p.startswith("body/")}
  return sorted(names, key=lambda n: int(n.rsplit("fc", 1)[1]))


def layers(params: dict) -> list[str]:
  """All layer names in network order: the body's, then 'head'."""
  return body_layers(params) + ["head"]


def forward(params: dict, x: np.ndarray):
  """(logits [b, C], cache) of inputs x [b, ...] (flattened to [b, d]); cache holds each
  layer's input and pre-activation for `backward`."""
  h = np.asarray(x, np.float64).reshape(x.shape[0], -1)
  cache = []
  for layer in body_layers(params):
    z = h @ params[layer + "/kernel"] + params[layer + "/bias"]
    cache.append((layer, h, z))
    h = np.maximum(z, 0.0)
  logits = h @ params["head/kernel"] + params["head/bias"]
  cache.append(("head", h, None))
  return logits, cache


def softmax(logits: np.ndarray) -> np.ndarray:
  """Row-wise softmax [b, C]."""
  e = np.exp(logits - logits.max(axis=1, keepdims=True))
  return e / e.sum(axis=1, keepdims=True)


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
  """Mean over rows of -log softmax(logits)[label]; logits [b, C], labels [b]."""
  shifted = logits - logits.max(axis=1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
  return float(-np.mean(log_probs[np.arange(len(labels)), labels]))


def loss_and_grads(params: dict, x: np.ndarray, y: np.ndarray):
  """(mean cross-entropy over the b rows of x [b, ...], y [b], its gradient: a dict like
  params), by backprop through the head and the ReLU layers."""
  logits, cache = forward(params, x)
  b = len(y)
  dlogits = softmax(logits)
  dlogits[np.arange(b), y] -= 1.0
  dlogits /= b
  grads = {}
  dout = dlogits
  for layer, h, z in reversed(cache):
    if z is not None:  # a body layer: through its ReLU first
      dout = dout * (z > 0)
    grads[layer + "/kernel"] = h.T @ dout
    grads[layer + "/bias"] = dout.sum(axis=0)
    dout = dout @ params[layer + "/kernel"].T
  return cross_entropy(logits, y), grads


def accuracy(params: dict, x: np.ndarray, y: np.ndarray) -> float:
  """Fraction of rows of x [t, ...] whose argmax logit is the label y [t]."""
  logits, _ = forward(params, x)
  return float(np.mean(np.argmax(logits, axis=1) == y))


# -- local training ------------------------------------------------------------------------
def epoch_orders(key, count: int, size: int, epochs: int) -> list[np.ndarray]:
  """The package's row order [size] of each epoch of one `sgd_epochs` call with `key`: the
  first `count` entries shuffle the real rows."""
  orders = []
  for epoch_key in jax.random.split(key, epochs):
    key_order, _ = jax.random.split(epoch_key)  # the second key is the steps' (dropout)
    orders.append(np.asarray(train.epoch_order(key_order, jnp.int32(count), size)))
  return orders


def sgd_epochs(params: dict, trainable: list[str], x, y, count: int, key, hp, epochs: int,
               batch_size: int):
  """(params, mean minibatch loss) after `epochs` of minibatch SGD on the names
  `trainable` (the rest frozen). x [m, ...], y [m] padded, the first `count` rows real.
  Each epoch's order is cut into minibatches of batch_size positions; a minibatch is the
  real rows among them (loss: their mean); a minibatch with none is no step. SGD as
  PyTorch's: g += wd * p; buf = momentum * buf + g (buf = 0 at the start of the call);
  p -= lr * buf. The mean loss is over the steps taken, each at the params before it."""
  params = {p: np.array(v, np.float64) for p, v in params.items()}
  lr, momentum, wd = float(hp.lr), float(hp.momentum), float(hp.weight_decay)
  buf = {p: np.zeros_like(params[p]) for p in trainable}
  size = x.shape[0]
  losses = []
  for order in epoch_orders(key, count, size, epochs):
    for start in range(0, math.ceil(size / batch_size) * batch_size, batch_size):
      rows = [order[j] for j in range(start, min(start + batch_size, count))]
      if not rows:
        continue
      loss, grads = loss_and_grads(params, x[rows], y[rows])
      losses.append(loss)
      for p in trainable:
        g = grads[p] + wd * params[p]
        buf[p] = momentum * buf[p] + g
        params[p] = params[p] - lr * buf[p]
  return params, (float(np.mean(losses)) if losses else 0.0)


def head_names(params: dict) -> list[str]:
  return [p for p in params if p.startswith("head/")]


def body_names(params: dict) -> list[str]:
  return [p for p in params if p.startswith("body/")]


def shared_names(name: str, params: dict) -> list[str]:
  """The params the server averages under algorithm `name`."""
  if name in ("fedrep", "fedper"):
    return body_names(params)
  if name == "lg-fedavg":  # the last two layers
    last = layers(params)[-2:]
    return [p for p in params if p.rsplit("/", 1)[0] in last]
  if name == "fedavg":
    return list(params)
  if name == "local":
    return []
  raise ValueError(name)


def client_update(name: str, params: dict, x, y, count: int, key, hp, *, local_epochs: int,
                  head_epochs: int, batch_size: int):
  """(trained params, mean loss) of one client starting from its params (shared + its
  personal) with its key fold_in(round_key, i). FedRep: head_epochs on the head (body
  frozen), then local_epochs on the body (head frozen), the loss of the body's; the others:
  local_epochs on all params at once."""
  if name == "fedrep":
    key_head, key_body = jax.random.split(key)
    params, _ = sgd_epochs(params, head_names(params), x, y, count, key_head, hp, head_epochs,
                           batch_size)
    return sgd_epochs(params, body_names(params), x, y, count, key_body, hp, local_epochs,
                      batch_size)
  return sgd_epochs(params, list(params), x, y, count, key, hp, local_epochs, batch_size)


# -- rounds and evaluation -----------------------------------------------------------------
def masked_round(name: str, shared: dict, personal: list[dict], key, data, hp, clients,
                 mask=None, *, local_epochs: int = 1, head_epochs: int = 0,
                 batch_size: int = 10):
  """One round: (shared, personal, train_loss). shared: the server's params {name: array};
  personal: client i's own params personal[i] {name: array}; data: numpy x [n, m, ...],
  y [n, m], counts [n] (attributes). Clients `clients` with mask True train from shared +
  their personal params (key fold_in(key, i)). The params `shared_names(name)` become the
  count-weighted mean of theirs (the server's, unchanged if none trained), the trained
  clients keep the rest as their personal params, every other client keeps its own.
  train_loss: the count-weighted mean of the trained clients' mean losses (0 if none)."""
  mask = [True] * len(clients) if mask is None else list(mask)
  params = {**shared, **personal[0]}
  averaged = shared_names(name, params)
  sums = {p: np.zeros_like(np.asarray(params[p], np.float64)) for p in averaged}
  total, loss_sum = 0.0, 0.0
  new_personal = [dict(p) for p in personal]
  for i, trains in zip(clients, mask):
    i = int(i)
    if not trains:
      continue
    count = int(data.counts[i])
    trained, loss = client_update(name, {**shared, **personal[i]},
                                  np.asarray(data.x[i], np.float64), np.asarray(data.y[i]),
                                  count, jax.random.fold_in(key, i), hp,
                                  local_epochs=local_epochs, head_epochs=head_epochs,
                                  batch_size=batch_size)
    for p in averaged:
      sums[p] += count * trained[p]
    new_personal[i] = {p: v for p, v in trained.items() if p not in averaged}
    total += count
    loss_sum += count * loss
  if total > 0:
    new_shared = {p: s / total for p, s in sums.items()}
  else:
    new_shared = {p: np.asarray(shared[p], np.float64) for p in averaged}
  return new_shared, new_personal, (loss_sum / total if total > 0 else 0.0)


def eval_params(shared: dict, personal: dict, data, i: int, hp=None, *, ft_epochs: int = 0,
                eval_key=None, batch_size: int = 10) -> dict:
  """The params client i is tested with: shared + its personal ones; with ft_epochs > 0
  (FedAvg-FT) after fine-tuning the head (body frozen) for ft_epochs on its train data with
  key fold_in(wrap_key_data(eval_key), i)."""
  params = {**shared, **personal}
  if not ft_epochs:
    return params
  key = jax.random.fold_in(jax.random.wrap_key_data(jnp.asarray(eval_key)), i)
  params, _ = sgd_epochs(params, head_names(params), np.asarray(data.x[i], np.float64),
                         np.asarray(data.y[i]), int(data.counts[i]), key, hp, ft_epochs,
                         batch_size)
  return params


def evaluate(shared: dict, personal: list[dict], data, hp=None, *, ft_epochs: int = 0,
             eval_key=None, batch_size: int = 10) -> dict:
  """test_accuracy (the mean over clients) and test_accuracy_std (their std, ddof 0) of
  every client's accuracy on its first test_counts[i] test rows (0 with none) with its
  `eval_params`."""
  accuracies = []
  for i in range(len(personal)):
    params = eval_params(shared, personal[i], data, i, hp, ft_epochs=ft_epochs,
                         eval_key=eval_key, batch_size=batch_size)
    t = int(data.test_counts[i])
    accuracies.append(accuracy(params, np.asarray(data.x_test[i][:t], np.float64),
                               np.asarray(data.y_test[i][:t])) if t else 0.0)
  return {"test_accuracy": float(np.mean(accuracies)),
          "test_accuracy_std": float(np.std(accuracies))}
