"""Independent numpy reference of neural FLUTE (nn/flute.py, nn/neural_collapse.py), float64:
the NC distance with its hand-derived gradient, the NC2 metrics, and whole FLUTE rounds of
an MLP built on nn_reference (its forward pass, PyTorch-style SGD and key derivation).

Written from the paper (Eq. 10, App. C.2) with the package's documented choices: the NC
distance of the normalised H^T H (H [F, C]) to (u u^T) o (I - 1 1^T / s) / sqrt(s - 1),
norm not squared; s = C for NC_i and Global NC2, s = |u| for Averaged Local NC2 (clients
with at least 2 classes); the server's step on the mean of NC_i over the clients that
trained.

The authors' conventions (`nn.conventions`) are switches: `flute_loss_and_grads`'
feature_sum (the feature penalty summed over a minibatch's rows), `client_update`'s
head_first (FLUTE*'s head epochs first, their momentum carried into the joint epochs) and
bias_decay, `masked_round`'s uniform (nn_reference's), and `untrained_round` (the option
average_untrained: clients that have not trained take the mean of the cohort's heads before
the server's NC step).
"""

import jax
import numpy as np

import nn_reference as ref


def class_mask(y, count: int, num_classes: int) -> np.ndarray:
  """Classes [C] (bool) of the first `count` labels of y [m]."""
  mask = np.zeros(num_classes, bool)
  mask[np.asarray(y)[:count]] = True
  return mask


def target(classes: np.ndarray, size: int) -> np.ndarray:
  """The ETF pattern [C, C] of `size` points on the classes [C] (bool)."""
  u = classes.astype(np.float64)
  centred = np.eye(len(u)) - np.ones((len(u), len(u))) / size
  return np.outer(u, u) * centred / np.sqrt(size - 1)


def etf_distance(kernel, classes, size: int) -> float:
  """|| G / ||G||_F - target ||_F with G = H^T H, H = kernel [F, C]."""
  gram = kernel.T @ kernel
  return float(np.linalg.norm(gram / np.linalg.norm(gram) - target(classes, size)))


def etf_distance_grad(kernel, classes, size: int) -> np.ndarray:
  """d etf_distance / d kernel [F, C], by hand: with G = H^T H, n = ||G||_F, E = G/n - T,
  D = ||E||_F, P = E / D: dD/dG = S = P / n - G <G, P> / n^3 and dD/dH = H (S + S^T)."""
  gram = kernel.T @ kernel
  n = np.linalg.norm(gram)
  error = gram / n - target(classes, size)
  p = error / np.linalg.norm(error)
  s = p / n - gram * np.sum(gram * p) / n ** 3
  return kernel @ (s + s.T)


def nc_term(kernel, classes) -> float:
  return etf_distance(kernel, classes, kernel.shape[1])


def nc2_metrics(kernels, classes) -> dict:
  """global_nc2: mean over clients of nc_term; local_nc2: mean over the clients with at
  least 2 classes of etf_distance with size = their number of classes."""
  local = [etf_distance(k, u, int(u.sum())) for k, u in zip(kernels, classes) if u.sum() >= 2]
  return {"global_nc2": float(np.mean([nc_term(k, u) for k, u in zip(kernels, classes)])),
          "local_nc2": float(np.mean(local)) if local else 0.0}


def flute_loss_and_grads(params, x, y, classes, *, feature_norm, head_norm, nc,
                         feature_sum: bool = False):
  """(mean CE over the rows x [b, ...], y [b], the gradient of mean CE + feature_norm
  mean ||h||^2 + head_norm ||H||_F^2 + nc NC(H)), h the body's output, by backprop.
  feature_sum: the feature term's sum of ||h||^2 over the rows instead of their mean (the
  option feature_sum, FLUTE's code)."""
  logits, cache = ref.forward(params, x)
  b = len(y)
  dlogits = ref.softmax(logits)
  dlogits[np.arange(b), y] -= 1.0
  dlogits /= b
  _, h, _ = cache[-1]
  kernel = params["head/kernel"]
  grads = {"head/kernel": h.T @ dlogits + 2 * head_norm * kernel
           + nc * etf_distance_grad(kernel, classes, kernel.shape[1]),
           "head/bias": dlogits.sum(axis=0)}
  dout = dlogits @ kernel.T + 2 * feature_norm * h / (1 if feature_sum else b)
  for layer, h_in, z in reversed(cache[:-1]):
    dout = dout * (z > 0)
    grads[layer + "/kernel"] = h_in.T @ dout
    grads[layer + "/bias"] = dout.sum(axis=0)
    dout = dout @ params[layer + "/kernel"].T
  return ref.cross_entropy(logits, y), grads


def client_update(params, x, y, count: int, key, hp, *, local_epochs, head_epochs,
                  batch_size, bias_decay: bool = True, head_first: bool = False, **lambdas):
  """(trained params, mean CE of the joint epochs): with (key_joint, key_head) =
  split(key), local_epochs of SGD on all params (key_joint), then head_epochs on the head
  alone (key_head), each phase with momentum buffers from zero. head_first (FLUTE*'s order
  in FLUTE's code): the head epochs first, then the joint ones starting from the head's
  momentum buffers (the body's from zero). lambdas: `flute_loss_and_grads`' keywords;
  bias_decay: `ref.sgd`'s."""
  classes = class_mask(y, count, params["head/kernel"].shape[1])
  key_joint, key_head = jax.random.split(key)

  def grad_fn(p, xb, yb):
    return flute_loss_and_grads(p, xb, yb, classes, **lambdas)

  def phase(params, trainable, phase_key, epochs, buf=None):
    return ref.sgd_momentum(params, trainable, grad_fn, x, y, count, phase_key, hp, epochs,
                            batch_size, bias_decay=bias_decay, buf=buf)

  if head_first:
    params, _, buf = phase(params, ref.head_names(params), key_head, head_epochs)
    params, loss, _ = phase(params, list(params), key_joint, local_epochs, buf)
    return params, loss
  params, loss, _ = phase(params, list(params), key_joint, local_epochs)
  if head_epochs:
    params, _, _ = phase(params, ref.head_names(params), key_head, head_epochs)
  return params, loss


def train_and_average(shared, personal, key, data, hp, clients, mask, *,
                      uniform: bool = False, **structure):
  """(shared, personal, train_loss, the clients that trained) of FLUTE's local training and
  server average: clients with mask True (None: all) train (`client_update` with key
  fold_in(key, i) and `structure`), the server averages their bodies weighted by counts (1
  each with uniform: the option uniform_average), and they keep their new heads."""
  def client(own, x, y, count, client_key):
    params, loss = client_update({**shared, **own}, x, y, count, client_key, hp, **structure)
    return ({p: params[p] for p in ref.body_names(params)},
            {p: params[p] for p in ref.head_names(params)}, loss)

  sent, weights, personal, loss = ref.train_cohort(client, personal, key, data, clients, mask,
                                                   uniform=uniform)
  mask = [True] * len(clients) if mask is None else list(mask)
  trained = [int(i) for i, trains in zip(clients, mask) if trains]
  return ref.server_update(shared, sent, weights, data.num_clients), personal, loss, trained


def nc_step(personal, data, trained: list[int], server_lr: float) -> list[dict]:
  """The server's step: each of the clients `trained` moves its head kernel by -server_lr /
  len(trained) times the gradient of its nc_term; the others keep theirs."""
  personal = [dict(p) for p in personal]
  for i in trained:
    kernel = personal[i]["head/kernel"]
    classes = class_mask(data.y[i], int(data.counts[i]), kernel.shape[1])
    personal[i]["head/kernel"] = kernel - server_lr / len(trained) * etf_distance_grad(
        kernel, classes, kernel.shape[1])
  return personal


def masked_round(shared, personal, key, data, hp, clients, mask, *, server_lr,
                 uniform: bool = False, **structure):
  """FLUTE's round: (shared, personal, train_loss): `train_and_average`, then `nc_step`."""
  shared, personal, loss, trained = train_and_average(shared, personal, key, data, hp, clients,
                                                      mask, uniform=uniform, **structure)
  return shared, nc_step(personal, data, trained, server_lr), loss


def untrained_round(shared, personal, untrained, key, data, hp, clients, mask, *, server_lr,
                    uniform: bool = False, **structure):
  """FLUTE's round with the option average_untrained: (shared, personal, untrained [n] bool,
  train_loss): `train_and_average`, then `ref.start_untrained` (the clients that have not
  trained yet take the mean of the new heads), then `nc_step` (on the heads of the clients
  that trained this round only)."""
  shared, personal, loss, trained = train_and_average(shared, personal, key, data, hp, clients,
                                                      mask, uniform=uniform, **structure)
  personal, untrained = ref.start_untrained(personal, untrained, data, clients, mask,
                                            uniform=uniform)
  return shared, nc_step(personal, data, trained, server_lr), untrained, loss
