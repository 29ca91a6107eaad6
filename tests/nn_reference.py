"""Independent numpy reference of the neural algorithms' rounds for an MLP, written plainly:
float64, a Python loop over clients, hand-written backprop, PyTorch-style SGD.

Params are flat dicts of numpy arrays named as the package names them: 'body/fc1/kernel',
'body/fc1/bias', ..., 'head/kernel', 'head/bias' (a Dense kernel is [in, out] and
y = x @ kernel + bias). The body is ReLU(dense) layers fc1, fc2, ...; the head is linear.

Randomness is an input: the shuffles come from the package's key derivation, replicated
here with jax.random calls (client i trains with fold_in(round_key, i); FedRep splits that
into (head key, body key), Ditto into (global key, personal key); L2GD splits the round
key into (coin key, clients' key) first; local training splits its key into one key per
epoch, each epoch key into (order key, step keys), and the epoch's order is
`train.epoch_order`).

The baselines (BASELINES) are written from their modules' docstrings: their local steps
are `sgd` with a gradient function of the algorithm's objective, their hyperparameters
the keyword `options` of `masked_round` and `evaluate`, named as `make_algorithm` names
them (prox_mu, ditto_lambda, apfl_alpha, maml_inner_lr, l2gd_p, l2gd_lambda).

The authors' conventions (`nn.conventions`) are switches of ALGORITHMS: bias_decay=False
(the option no_bias_decay: `sgd` leaves biases undecayed), uniform=True (uniform_average:
`masked_round` weighs the trained clients 1 each instead of their sample counts) and
`start_untrained` (average_untrained, after each round). `sgd_momentum` starts from and
returns SGD's momentum buffers (FLUTE*'s head-first order, in flute_reference).
"""

import math
import types

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.data import flat
from fedjax_rep.nn import train

ALGORITHMS = ("fedrep", "fedper", "lg-fedavg", "fedavg", "local")
BASELINES = ("fedprox", "scaffold", "ditto", "apfl", "per-fedavg", "l2gd")
CONTROL = "control/"  # SCAFFOLD's control variates: 'control/<param>'


def per_client(data):
  """`data` as the reference reads it, client i's x[i], y[i] (its training rows, padded or
  not: a shuffle of a client's rows does not depend on its padding), counts[i], x_test[i],
  y_test[i], test_counts[i] and num_clients: ClientDatasets as they are; FlatClients with
  client i's rows from the store, unpadded."""
  if not isinstance(data, flat.FlatClients):
    return data
  x, y = np.asarray(data.x), np.asarray(data.y)
  rows = lambda a, offsets, counts: [a[o:o + c] for o, c in zip(np.asarray(offsets),
                                                                np.asarray(counts))]
  return types.SimpleNamespace(
      x=rows(x, data.offsets, data.counts), y=rows(y, data.offsets, data.counts),
      counts=np.asarray(data.counts), x_test=rows(x, data.test_offsets, data.test_counts),
      y_test=rows(y, data.test_offsets, data.test_counts),
      test_counts=np.asarray(data.test_counts), num_clients=data.num_clients)


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
  return cross_entropy(logits, y), backward(params, cache, dlogits)


def backward(params: dict, cache: list, dlogits: np.ndarray) -> dict:
  """The gradient (a dict like params) of a loss whose gradient w.r.t. the logits of
  `forward(params, x)` (its `cache`) is dlogits [b, C]: backprop through the head and the
  ReLU layers."""
  grads, dout = {}, dlogits
  for layer, h, z in reversed(cache):
    if z is not None:  # a body layer: through its ReLU first
      dout = dout * (z > 0)
    grads[layer + "/kernel"] = h.T @ dout
    grads[layer + "/bias"] = dout.sum(axis=0)
    dout = dout @ params[layer + "/kernel"].T
  return grads


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


def sgd(params: dict, trainable: list, grad_fn, x, y, count: int, key, hp, epochs: int,
        batch_size: int, *, bias_decay: bool = True):
  """(params, mean minibatch loss) after `epochs` of minibatch SGD on the names
  `trainable` (the rest frozen), a step's (loss, gradient) being grad_fn(params, xb, yb)
  (the gradient a dict over at least `trainable`) of its minibatch xb, yb: the real rows of
  its positions, in position order. x [m, ...], y [m] padded, the first `count` rows real.
  Each epoch's order is cut into minibatches of batch_size positions; a minibatch with no
  real row is no step. SGD as PyTorch's: g += wd * p; buf = momentum * buf + g (buf = 0 at
  the start of the call); p -= lr * buf, wd = `decay(p)` (bias_decay=False: 0 on biases).
  The mean loss is over the steps taken, each at the params before it."""
  params, loss, _ = sgd_momentum(params, trainable, grad_fn, x, y, count, key, hp, epochs,
                                 batch_size, bias_decay=bias_decay)
  return params, loss


def sgd_momentum(params: dict, trainable: list, grad_fn, x, y, count: int, key, hp,
                 epochs: int, batch_size: int, *, bias_decay: bool = True,
                 buf: dict | None = None):
  """`sgd` from the momentum buffers `buf` ({name: array like the param}; None, or a name of
  `trainable` not in it: zeros, as a PyTorch optimiser's state of a param that had no
  gradient yet), also returning them: (params, mean minibatch loss, buf over `trainable`)."""
  params = {p: np.array(v, np.float64) for p, v in params.items()}
  lr, momentum = float(hp.lr), float(hp.momentum)
  buf = {p: np.array((buf or {}).get(p, np.zeros_like(params[p])), np.float64)
         for p in trainable}
  size = x.shape[0]
  losses = []
  for order in epoch_orders(key, count, size, epochs):
    for start in range(0, math.ceil(size / batch_size) * batch_size, batch_size):
      rows = [order[j] for j in range(start, min(start + batch_size, count))]
      if not rows:
        continue
      loss, grads = grad_fn(params, x[rows], y[rows])
      losses.append(loss)
      for p in trainable:
        g = grads[p] + decay(p, hp, bias_decay) * params[p]
        buf[p] = momentum * buf[p] + g
        params[p] = params[p] - lr * buf[p]
  return params, (float(np.mean(losses)) if losses else 0.0), buf


def decay(name, hp, bias_decay: bool = True) -> float:
  """The weight decay of the param `name`: hp's, or 0 for a bias (a name ending in '/bias')
  with bias_decay=False (the authors' codes put biases in a group without decay)."""
  if not bias_decay and name.endswith("/bias"):
    return 0.0
  return float(hp.weight_decay)


def sgd_epochs(params: dict, trainable: list[str], x, y, count: int, key, hp, epochs: int,
               batch_size: int, *, bias_decay: bool = True):
  """`sgd` on a minibatch's mean cross-entropy (its loss: the mean over its real rows)."""
  return sgd(params, trainable, loss_and_grads, x, y, count, key, hp, epochs, batch_size,
             bias_decay=bias_decay)


def proximal(grad_fn, center: dict, mu: float):
  """grad_fn with the gradient mu (p - center) of (mu / 2) ||params - center||^2 added to
  every parameter's; the loss stays grad_fn's."""
  def fn(params, xb, yb):
    loss, grads = grad_fn(params, xb, yb)
    return loss, {p: g + mu * (params[p] - center[p]) for p, g in grads.items()}

  return fn


def mixed(w: dict, v: dict, alpha: float) -> dict:
  """APFL's v_bar = alpha v + (1 - alpha) w, parameter by parameter."""
  return {p: alpha * v[p] + (1 - alpha) * w[p] for p in w}


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
                  head_epochs: int, batch_size: int, bias_decay: bool = True):
  """(trained params, mean loss) of one client starting from its params (shared + its
  personal) with its key fold_in(round_key, i). FedRep: head_epochs on the head (body
  frozen), then local_epochs on the body (head frozen), the loss of the body's; the others:
  local_epochs on all params at once. bias_decay: `sgd`'s."""
  if name == "fedrep":
    key_head, key_body = jax.random.split(key)
    params, _ = sgd_epochs(params, head_names(params), x, y, count, key_head, hp, head_epochs,
                           batch_size, bias_decay=bias_decay)
    return sgd_epochs(params, body_names(params), x, y, count, key_body, hp, local_epochs,
                      batch_size, bias_decay=bias_decay)
  return sgd_epochs(params, list(params), x, y, count, key, hp, local_epochs, batch_size,
                    bias_decay=bias_decay)


# -- the baselines' clients: each (what it sends, its new personal params, mean loss) ------
def fedprox_client(shared, x, y, count, key, hp, *, epochs, batch_size, prox_mu):
  """FedProx: epochs of SGD from the global model w_g on CE + (prox_mu / 2) ||w - w_g||^2
  (the loss reported: CE); sends w, keeps nothing."""
  grad_fn = proximal(loss_and_grads, shared, prox_mu)
  trained, loss = sgd(shared, list(shared), grad_fn, x, y, count, key, hp, epochs, batch_size)
  return trained, {}, loss


def scaffold_client(shared, personal, x, y, count, key, hp, *, epochs, batch_size):
  """SCAFFOLD: epochs of SGD from w_g on CE with every gradient corrected by c - c_i (c the
  server's 'control/<p>', c_i the client's), K = epochs ceil(count / batch_size) steps;
  c_i+ = c_i - c + (w_g - w_i) / (K lr). Sends w_i and c_i+ - c_i (under 'control/'),
  keeps c_i+."""
  model = {p: v for p, v in shared.items() if not p.startswith(CONTROL)}
  c = {p: shared[CONTROL + p] for p in model}
  c_i = {p: personal[CONTROL + p] for p in model}

  def grad_fn(params, xb, yb):
    loss, grads = loss_and_grads(params, xb, yb)
    return loss, {p: g + c[p] - c_i[p] for p, g in grads.items()}

  trained, loss = sgd(model, list(model), grad_fn, x, y, count, key, hp, epochs, batch_size)
  steps = epochs * math.ceil(count / batch_size)
  new_c_i = {p: c_i[p] - c[p] + (model[p] - trained[p]) / (steps * float(hp.lr))
             for p in model}
  sent = {**trained, **{CONTROL + p: new_c_i[p] - c_i[p] for p in model}}
  return sent, {CONTROL + p: v for p, v in new_c_i.items()}, loss


def ditto_client(shared, personal, x, y, count, key, hp, *, epochs, batch_size, ditto_lambda):
  """Ditto: with (key_global, key_personal) = split(key), epochs of SGD on CE from w_g
  (key_global; sent), then epochs of SGD on CE + (ditto_lambda / 2) ||v - w_g||^2 from
  the client's v (key_personal; kept, its CE the loss reported)."""
  key_global, key_personal = jax.random.split(key)
  w, _ = sgd_epochs(shared, list(shared), x, y, count, key_global, hp, epochs, batch_size)
  grad_fn = proximal(loss_and_grads, shared, ditto_lambda)
  v, loss = sgd(personal, list(personal), grad_fn, x, y, count, key_personal, hp, epochs,
                batch_size)
  return w, v, loss


def apfl_client(shared, personal, x, y, count, key, hp, *, epochs, batch_size, apfl_alpha):
  """APFL: epochs of joint SGD steps on (w, v) from (w_g, the client's v), one minibatch a
  step: w along grad CE(w), v along apfl_alpha grad CE(v_bar), v_bar = `mixed(w, v)`
  (weight decay and momentum per parameter of both; the loss reported: CE(v_bar)). Sends
  w, keeps v."""
  joint = {**{("w", p): v for p, v in shared.items()},
           **{("v", p): v for p, v in personal.items()}}

  def grad_fn(params, xb, yb):
    w = {p: params["w", p] for p in shared}
    v = {p: params["v", p] for p in shared}
    _, grads_w = loss_and_grads(w, xb, yb)
    loss, grads_mixed = loss_and_grads(mixed(w, v, apfl_alpha), xb, yb)
    return loss, {**{("w", p): g for p, g in grads_w.items()},
                  **{("v", p): apfl_alpha * g for p, g in grads_mixed.items()}}

  trained, loss = sgd(joint, list(joint), grad_fn, x, y, count, key, hp, epochs, batch_size)
  return ({p: trained["w", p] for p in shared}, {p: trained["v", p] for p in personal}, loss)


def adapted(params: dict, x, y, inner_lr: float) -> dict:
  """params - inner_lr grad CE(params; x, y) (one MAML inner step on the rows x, y)."""
  _, grads = loss_and_grads(params, x, y)
  return {p: v - inner_lr * grads[p] for p, v in params.items()}


def per_fedavg_client(shared, x, y, count, key, hp, *, epochs, batch_size, maml_inner_lr):
  """Per-FedAvg (first order): epochs of SGD from w_g whose step, on the real rows D of its
  first batch_size // 2 positions and D' of the rest, has loss CE(w'; D') and gradient
  grad CE(w'; D') at w' = `adapted(w, D)` (both 0 when D' has no real row). Sends w, keeps
  nothing."""
  half = batch_size // 2

  def grad_fn(params, xb, yb):
    if len(yb) <= half:
      return 0.0, {p: np.zeros_like(v) for p, v in params.items()}
    return loss_and_grads(adapted(params, xb[:half], yb[:half], maml_inner_lr), xb[half:],
                          yb[half:])

  trained, loss = sgd(shared, list(shared), grad_fn, x, y, count, key, hp, epochs, batch_size)
  return trained, {}, loss


def client_round(name: str, shared: dict, personal: dict, x, y, count: int, key, hp, *,
                 local_epochs: int, head_epochs: int, batch_size: int,
                 bias_decay: bool = True, **options):
  """(what a client of algorithm `name` sends the server, its new personal params, its mean
  loss) after training from the server's params `shared` and its own `personal` with its
  key fold_in(round_key, i). ALGORITHMS send their `shared_names` params of
  `client_update`'s (bias_decay: `sgd`'s) and keep the rest."""
  structure = dict(epochs=local_epochs, batch_size=batch_size)
  if name == "fedprox":
    return fedprox_client(shared, x, y, count, key, hp, **structure,
                          prox_mu=options["prox_mu"])
  if name == "scaffold":
    return scaffold_client(shared, personal, x, y, count, key, hp, **structure)
  if name == "ditto":
    return ditto_client(shared, personal, x, y, count, key, hp, **structure,
                        ditto_lambda=options["ditto_lambda"])
  if name == "apfl":
    return apfl_client(shared, personal, x, y, count, key, hp, **structure,
                       apfl_alpha=options["apfl_alpha"])
  if name == "per-fedavg":
    return per_fedavg_client(shared, x, y, count, key, hp, **structure,
                             maml_inner_lr=options["maml_inner_lr"])
  trained, loss = client_update(name, {**shared, **personal}, x, y, count, key, hp,
                                local_epochs=local_epochs, head_epochs=head_epochs,
                                batch_size=batch_size, bias_decay=bias_decay)
  averaged = shared_names(name, trained)
  return ({p: trained[p] for p in averaged},
          {p: v for p, v in trained.items() if p not in averaged}, loss)


# -- rounds and evaluation -----------------------------------------------------------------
def server_update(shared: dict, sent: list[dict], weights: list[float],
                  num_clients: int) -> dict:
  """The server's new params from what the trained clients sent (`sent`, their weights
  `weights`: sample counts, or 1 each with the option uniform_average): the weighted mean
  of the model params (the server's, unchanged, if none trained); SCAFFOLD's control c
  ('control/<p>') + the sum of the sent c_i+ - c_i over the num_clients clients."""
  total = sum(weights)
  new = {}
  for p, v in shared.items():
    v = np.asarray(v, np.float64)
    if p.startswith(CONTROL):
      new[p] = v + sum(s[p] for s in sent) / num_clients
    elif total > 0:
      new[p] = sum(w * s[p] for w, s in zip(weights, sent)) / total
    else:
      new[p] = v
  return new


def masked_round(name: str, shared: dict, personal: list[dict], key, data, hp, clients,
                 mask=None, *, local_epochs: int = 1, head_epochs: int = 0,
                 batch_size: int = 10, bias_decay: bool = True, uniform: bool = False,
                 **options):
  """One round: (shared, personal, train_loss). shared: the server's params {name: array};
  personal: client i's own params personal[i] {name: array}; data: numpy x [n, m, ...],
  y [n, m], counts [n] (attributes); options: the baselines' hyperparameters. Clients
  `clients` with mask True train (`client_round`, key fold_in(key, i)); the server updates
  its params from what they sent (`server_update`), they keep their new personal params,
  every other client keeps its own. train_loss: the weighted mean of the trained clients'
  mean losses (0 if none). The weights are the sample counts, or 1 each with uniform (the
  option uniform_average); bias_decay=False: no weight decay on biases (`sgd`); both written
  for ALGORITHMS only. L2GD: `l2gd_round`. (The option average_untrained: `start_untrained`
  after it.)"""
  if name not in ALGORITHMS and (uniform or not bias_decay):
    raise ValueError(f"{name}: uniform and bias_decay are written for {ALGORITHMS} only")
  if name == "l2gd":
    return l2gd_round(shared, personal, key, data, hp, clients, mask,
                      local_epochs=local_epochs, batch_size=batch_size,
                      l2gd_p=options["l2gd_p"], l2gd_lambda=options["l2gd_lambda"])
  def client(own, x, y, count, client_key):
    return client_round(name, shared, own, x, y, count, client_key, hp,
                        local_epochs=local_epochs, head_epochs=head_epochs,
                        batch_size=batch_size, bias_decay=bias_decay, **options)

  sent, weights, new_personal, loss = train_cohort(client, personal, key, data, clients, mask,
                                                   uniform=uniform)
  return server_update(shared, sent, weights, data.num_clients), new_personal, loss


def server_weight(data, i: int, uniform: bool = False) -> float:
  """The server's weight of client i: its sample count, or 1 with uniform."""
  return 1.0 if uniform else int(data.counts[i])


def train_cohort(client, personal: list[dict], key, data, clients, mask=None, *,
                 uniform: bool = False):
  """(what the trained clients sent [dicts], their `server_weight`s, every client's personal
  params, train_loss): clients `clients` with mask True (None: all) train, client i as
  client(personal[i], x_i [m, ...] float64, y_i [m], count_i, fold_in(key, i)) -> (sent,
  its new personal params, its mean loss); the others keep theirs. train_loss: the
  weighted mean of the trained clients' losses (0 if none)."""
  mask = [True] * len(clients) if mask is None else list(mask)
  new_personal = [dict(p) for p in personal]
  sent, weights, loss_sum = [], [], 0.0
  for i, trains in zip(clients, mask):
    i = int(i)
    if not trains:
      continue
    client_sent, new_personal[i], loss = client(
        personal[i], np.asarray(data.x[i], np.float64), np.asarray(data.y[i]),
        int(data.counts[i]), jax.random.fold_in(key, i))
    sent.append(client_sent)
    weights.append(server_weight(data, i, uniform))
    loss_sum += weights[-1] * loss
  total = sum(weights)
  return sent, weights, new_personal, (loss_sum / total if total > 0 else 0.0)


def start_untrained(personal: list[dict], untrained, data, clients, mask=None, *,
                    uniform: bool = False):
  """The option average_untrained after a round of clients `clients` (those with mask True
  trained; None: all), `personal` the clients' params after it: (personal, untrained [n]
  bool) with the trained clients marked trained in `untrained` [n] (bool, the clients that
  had not trained before) and every client still untrained given the `server_weight`ed
  mean of the trained clients' personal params (unchanged if none trained)."""
  mask = [True] * len(clients) if mask is None else list(mask)
  trained = [int(i) for i, trains in zip(clients, mask) if trains]
  untrained = np.array(untrained, bool)
  untrained[trained] = False
  personal = [dict(p) for p in personal]
  if not trained:
    return personal, untrained
  weights = [server_weight(data, i, uniform) for i in trained]
  mean = {p: sum(w * personal[i][p] for w, i in zip(weights, trained)) / sum(weights)
          for p in personal[0]}
  for i in np.flatnonzero(untrained):
    personal[i] = dict(mean)
  return personal, untrained


def l2gd_averages(key, l2gd_p: float) -> bool:
  """Whether L2GD's round with key `key` averages: uniform(coin key) < l2gd_p, the coin key
  the first of split(key)."""
  key_coin, _ = jax.random.split(key)
  return bool(jax.random.uniform(key_coin) < l2gd_p)


def l2gd_round(shared: dict, personal: list[dict], key, data, hp, clients, mask=None, *,
               local_epochs: int, batch_size: int, l2gd_p: float, l2gd_lambda: float):
  """L2GD's round (all params personal; `shared` is empty): with key_clients the second of
  split(key), a local round ("local"'s `masked_round` with key_clients and step size
  lr / (1 - l2gd_p)) unless `l2gd_averages`; then every unmasked cohort client moves
  x_i <- x_i - theta (x_i - x_bar), theta = min(1, lr l2gd_lambda / l2gd_p), x_bar their
  count-weighted mean, and train_loss is their count-weighted mean CE on their train data
  before the move (0 with none)."""
  _, key_clients = jax.random.split(key)
  if not l2gd_averages(key, l2gd_p):
    return masked_round("local", shared, personal, key_clients, data,
                        hp.replace(lr=float(hp.lr) / (1 - l2gd_p)), clients, mask,
                        local_epochs=local_epochs, batch_size=batch_size)
  mask = [True] * len(clients) if mask is None else list(mask)
  moving = [int(i) for i, moves in zip(clients, mask) if moves]
  new_personal = [dict(p) for p in personal]
  if not moving:
    return dict(shared), new_personal, 0.0
  counts = [int(data.counts[i]) for i in moving]
  total = sum(counts)
  center = {p: sum(c * personal[i][p] for c, i in zip(counts, moving)) / total
            for p in personal[0]}
  theta = min(1.0, float(hp.lr) * l2gd_lambda / l2gd_p)
  loss_sum = 0.0
  for count, i in zip(counts, moving):
    logits, _ = forward(personal[i], np.asarray(data.x[i][:count], np.float64))
    loss_sum += count * cross_entropy(logits, np.asarray(data.y[i][:count]))
    new_personal[i] = {p: v - theta * (v - center[p]) for p, v in personal[i].items()}
  return dict(shared), new_personal, loss_sum / total


def eval_params(shared: dict, personal: dict, data, i: int, hp=None, *,
                name: str | None = None, ft_epochs: int = 0, eval_key=None,
                batch_size: int = 10, **options) -> dict:
  """The params client i of algorithm `name` is tested with: Ditto its own v, APFL
  `mixed(server's w, its v)`, Per-FedAvg `adapted(w, all its train rows)`; the others
  shared + its personal params (SCAFFOLD's without the controls), and with ft_epochs > 0
  (the "+FT" variants) after fine-tuning the head (body frozen) for ft_epochs on its train
  data with key fold_in(wrap_key_data(eval_key), i)."""
  if name == "ditto":
    return dict(personal)
  if name == "apfl":
    return mixed(shared, personal, options["apfl_alpha"])
  x, y, count = np.asarray(data.x[i], np.float64), np.asarray(data.y[i]), int(data.counts[i])
  if name == "per-fedavg":
    return adapted(shared, x[:count], y[:count], options["maml_inner_lr"])
  params = {p: v for p, v in {**shared, **personal}.items() if not p.startswith(CONTROL)}
  if not ft_epochs:
    return params
  key = jax.random.fold_in(jax.random.wrap_key_data(jnp.asarray(eval_key)), i)
  params, _ = sgd_epochs(params, head_names(params), x, y, count, key, hp, ft_epochs,
                         batch_size)
  return params


def evaluate(shared: dict, personal: list[dict], data, hp=None, *,
             name: str | None = None, ft_epochs: int = 0, eval_key=None,
             batch_size: int = 10, **options) -> dict:
  """Every client with test samples tested on its first test_counts[i] test rows with its
  `eval_params` (clients without any are left out): test_accuracy (the mean of their
  accuracies), test_accuracy_weighted (over all their test samples), test_accuracy_std
  (std, ddof 0), test_accuracy_p10 (10th percentile) and test_clients (how many)."""
  accuracies, weights = [], []
  for i in range(len(personal)):
    t = int(data.test_counts[i])
    if not t:
      continue
    params = eval_params(shared, personal[i], data, i, hp, name=name, ft_epochs=ft_epochs,
                         eval_key=eval_key, batch_size=batch_size, **options)
    accuracies.append(accuracy(params, np.asarray(data.x_test[i][:t], np.float64),
                               np.asarray(data.y_test[i][:t])))
    weights.append(t)
  return statistics(accuracies, weights)


def statistics(accuracies: list[float], weights: list[int], prefix: str = "test_",
               count: str = "test_clients") -> dict:
  """The metrics of the tested clients' accuracies (weights: their test counts):
  PREFIXaccuracy (the mean), _weighted, _std (ddof 0), _p10 and COUNT (how many)."""
  return {f"{prefix}accuracy": float(np.mean(accuracies)),
          f"{prefix}accuracy_weighted": float(np.average(accuracies, weights=weights)),
          f"{prefix}accuracy_std": float(np.std(accuracies)),
          f"{prefix}accuracy_p10": float(np.percentile(accuracies, 10)),
          count: len(accuracies)}


# -- new clients ---------------------------------------------------------------------------
def new_client_params(name: str, shared: dict, data, i: int, key, hp, epochs: int,
                      batch_size: int, fresh: dict) -> dict:
  """The params new client i of algorithm `name` is tested with (the package's
  `new_clients`), `fresh` being the model's initial params the client drew (with the first
  key of split(its key)): FedRep, FedPer, FedAvg and FedAvg-FT keep the server's body
  (`shared`) and train a head from zero, body frozen, for `epochs` epochs with the client's
  key, the i-th of split(key, n); LG-FedAvg and local only keep the server's shared params
  and train their personal ones from `fresh` (heads from zero) with the second key of
  split(its key)."""
  x, y, count = np.asarray(data.x[i], np.float64), np.asarray(data.y[i]), int(data.counts[i])
  client_key = jax.random.split(key, data.num_clients)[i]
  zeros = {p: np.zeros_like(v, np.float64) for p, v in fresh.items() if p.startswith("head/")}
  if name in ("fedrep", "fedper", "fedavg", "fedavg-ft"):
    params = {**{p: v for p, v in shared.items() if p.startswith("body/")}, **zeros}
    return sgd_epochs(params, head_names(params), x, y, count, client_key, hp, epochs,
                      batch_size)[0]
  common = shared_names(name, fresh)
  params = {p: np.asarray(shared[p] if p in common else zeros.get(p, v), np.float64)
            for p, v in fresh.items()}
  _, train_key = jax.random.split(client_key)
  personal = [p for p in params if p not in common]
  return sgd_epochs(params, personal, x, y, count, train_key, hp, epochs, batch_size)[0]


def new_clients(name: str, shared: dict, data, key, hp, epochs: int, batch_size: int,
                fresh: list[dict]) -> dict:
  """`evaluate`'s metrics, named new_* (its client count new_client_count), of the new
  clients `data`, each tested with its `new_client_params` (fresh[i]: client i's draw)."""
  accuracies, weights = [], []
  for i in range(data.num_clients):
    t = int(data.test_counts[i])
    params = new_client_params(name, shared, data, i, key, hp, epochs, batch_size, fresh[i])
    accuracies.append(accuracy(params, np.asarray(data.x_test[i][:t], np.float64),
                               np.asarray(data.y_test[i][:t])))
    weights.append(t)
  return statistics(accuracies, weights, "new_", "new_client_count")
