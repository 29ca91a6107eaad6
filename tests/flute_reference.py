"""Independent numpy reference of neural FLUTE (nn/flute.py, nn/neural_collapse.py), float64:
the NC distance with its hand-derived gradient, the NC2 metrics, and whole FLUTE rounds of
an MLP built on nn_reference (its forward pass, PyTorch-style SGD and key derivation).

Written from the paper (Eq. 10, App. C.2) with the package's documented choices: the NC
distance of the normalised H^T H (H [F, C]) to (u u^T) o (I - 1 1^T / s) / sqrt(s - 1),
norm not squared; s = C for NC_i and Global NC2, s = |u| for Averaged Local NC2 (clients
with at least 2 classes); the server's step on the mean of NC_i over the clients that
trained.
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


def flute_loss_and_grads(params, x, y, classes, *, feature_norm, head_norm, nc):
  """(mean CE over the rows x [b, ...], y [b], the gradient of mean CE + feature_norm
  mean ||h||^2 + head_norm ||H||_F^2 + nc NC(H)), h the body's output, by backprop."""
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
  dout = dlogits @ kernel.T + 2 * feature_norm * h / b
  for layer, h_in, z in reversed(cache[:-1]):
    dout = dout * (z > 0)
    grads[layer + "/kernel"] = h_in.T @ dout
    grads[layer + "/bias"] = dout.sum(axis=0)
    dout = dout @ params[layer + "/kernel"].T
  return ref.cross_entropy(logits, y), grads


def client_update(params, x, y, count: int, key, hp, *, local_epochs, head_epochs,
                  batch_size, **lambdas):
  """(trained params, mean CE of the joint epochs): with (key_joint, key_head) =
  split(key), local_epochs of SGD on all params, then head_epochs on the head alone."""
  classes = class_mask(y, count, params["head/kernel"].shape[1])
  key_joint, key_head = jax.random.split(key)

  def grad_fn(p, xb, yb):
    return flute_loss_and_grads(p, xb, yb, classes, **lambdas)

  params, loss = ref.sgd(params, list(params), grad_fn, x, y, count, key_joint, hp,
                         local_epochs, batch_size)
  if head_epochs:
    params, _ = ref.sgd(params, ref.head_names(params), grad_fn, x, y, count, key_head, hp,
                        head_epochs, batch_size)
  return params, loss


def masked_round(shared, personal, key, data, hp, clients, mask, *, server_lr, **structure):
  """FLUTE's round: (shared, personal, train_loss). Clients with mask True train
  (client_update with key fold_in(key, i)), the server averages their bodies weighted by
  counts, then moves each of their head kernels by -server_lr / (number trained) times the
  gradient of its nc_term."""
  mask = [True] * len(clients) if mask is None else list(mask)
  personal = [dict(p) for p in personal]
  sent, counts, losses, trained = [], [], [], []
  for i, trains in zip(clients, mask):
    i = int(i)
    if not trains:
      continue
    count = int(data.counts[i])
    params, loss = client_update(
        {**shared, **personal[i]}, np.asarray(data.x[i], np.float64), np.asarray(data.y[i]),
        count, jax.random.fold_in(key, i), hp, **structure)
    sent.append({p: params[p] for p in ref.body_names(params)})
    personal[i] = {p: params[p] for p in ref.head_names(params)}
    counts.append(count)
    losses.append(loss)
    trained.append(i)
  shared = ref.server_update(shared, sent, counts, data.num_clients)
  for i in trained:
    kernel = personal[i]["head/kernel"]
    classes = class_mask(data.y[i], int(data.counts[i]), kernel.shape[1])
    personal[i]["head/kernel"] = kernel - server_lr / len(trained) * etf_distance_grad(
        kernel, classes, kernel.shape[1])
  total = sum(counts)
  loss = sum(c * l for c, l in zip(counts, losses)) / total if total else 0.0
  return shared, personal, loss
