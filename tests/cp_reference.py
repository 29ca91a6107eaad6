"""Independent numpy reference of FedCP's rounds and evaluation for an MLP, written plainly
from the algorithm (PFLlib's clientcp.py / servercp.py, as nn/fedcp.py's docstring and
docs/papers/flute.md state it): float64, a Python loop over clients, hand-written
backprop through the body, the conditional policy network (Dense, LayerNorm, ReLU), the
Gumbel-softmax masks, both heads and the MMD term.

Params are flat dicts named as the package names them: the body 'body/fc1/kernel', ...
(nn_reference's MLP), the personal head 'head/kernel' [F, C] and 'head/bias', the global
head 'global_head/kernel' and 'global_head/bias', the CPN 'cpn/fc/kernel' [F, 2F],
'cpn/fc/bias' [2F], 'cpn/norm/scale' [2F] and 'cpn/norm/bias' [2F].

Randomness is an input, derived with the package's jax.random calls: client i trains with
fold_in(round_key, i) (shuffles as nn_reference's); the step at position s of an epoch has
the s-th of split(steps key, ceil(m / batch_size)), the steps key the second of
split(epoch key); a step's Gumbel noise is jax.random.gumbel(split(step key)[0],
[batch_size, 2, F]), row j of the minibatch taking row j. In evaluation client i's noise is
jax.random.gumbel(split(fold_in(wrap_key_data(eval_key), i))[0], [t, 2, F]), t the padded
test size.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

import nn_reference as ref

GLOBAL = "global_head/"
EPS = 1e-5  # LayerNorm's
BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)


# -- the pieces ----------------------------------------------------------------------------
def body_forward(params: dict, x: np.ndarray):
  """(features h [b, F], cache) of inputs x [b, ...]: ReLU(dense) layers fc1, fc2, ..."""
  h = np.asarray(x, np.float64).reshape(x.shape[0], -1)
  cache = []
  for layer in ref.body_layers(params):
    z = h @ params[layer + "/kernel"] + params[layer + "/bias"]
    cache.append((layer, h, z))
    h = np.maximum(z, 0.0)
  return h, cache


def body_backward(params: dict, cache, dh: np.ndarray) -> dict:
  """Gradients of the body's params given dh [b, F] (the gradient w.r.t. its output)."""
  grads = {}
  for layer, h, z in reversed(cache):
    dz = dh * (z > 0)
    grads[layer + "/kernel"] = h.T @ dz
    grads[layer + "/bias"] = dz.sum(axis=0)
    dh = dz @ params[layer + "/kernel"].T
  return grads


def context(head_kernel: np.ndarray) -> np.ndarray:
  """The context [F]: the head kernel [F, C] summed over classes, over its L2 norm."""
  c = np.asarray(head_kernel, np.float64).sum(axis=1)
  return c / max(np.linalg.norm(c), 1e-12)


def policy_forward(params: dict, u: np.ndarray):
  """(scores [b, 2, F], cache) of policy inputs u [b, F]: ReLU(LayerNorm(u W + b))."""
  a = u @ params["cpn/fc/kernel"] + params["cpn/fc/bias"]
  mean = a.mean(axis=1, keepdims=True)
  std = np.sqrt(((a - mean) ** 2).mean(axis=1, keepdims=True) + EPS)
  a_hat = (a - mean) / std
  n = params["cpn/norm/scale"] * a_hat + params["cpn/norm/bias"]
  scores = np.maximum(n, 0.0)
  return scores.reshape(len(u), 2, -1), (u, a_hat, std, n)


def policy_backward(params: dict, cache, dscores: np.ndarray):
  """(gradients of the CPN's params, du [b, F]) given dscores [b, 2, F]."""
  u, a_hat, std, n = cache
  dn = dscores.reshape(len(u), -1) * (n > 0)
  grads = {"cpn/norm/scale": (dn * a_hat).sum(axis=0), "cpn/norm/bias": dn.sum(axis=0)}
  da_hat = dn * params["cpn/norm/scale"]
  da = (da_hat - da_hat.mean(axis=1, keepdims=True)
        - a_hat * (da_hat * a_hat).mean(axis=1, keepdims=True)) / std
  grads["cpn/fc/kernel"] = u.T @ da
  grads["cpn/fc/bias"] = da.sum(axis=0)
  return grads, da @ params["cpn/fc/kernel"].T


def masks(scores: np.ndarray, noise: np.ndarray):
  """(personal mask, global mask) [b, F] of scores and Gumbel noise [b, 2, F]: a softmax
  over two (tau 1), the personal one sigmoid(t_p - t_g) of t = scores + noise."""
  t = scores + noise
  personal = 1.0 / (1.0 + np.exp(-(t[:, 0] - t[:, 1])))
  return personal, 1.0 - personal


def kernel(u: np.ndarray, v: np.ndarray):
  """(K [b, b'] with K_ij = sum_a exp(-|u_i - v_j|^2 / (2a)), its gradient w.r.t. u_i
  [b, b', F])."""
  diff = u[:, None, :] - v[None, :, :]
  d = (diff ** 2).sum(axis=2)
  k, g = np.zeros(d.shape), np.zeros(diff.shape)
  for a in BANDWIDTHS:
    e = np.exp(-d / (2 * a))
    k += e
    g += e[:, :, None] * (-diff / a)
  return k, g


def mmd(x: np.ndarray, y: np.ndarray):
  """(MMD^2 of the rows of x and y [b, F]: mean K(x, x) + mean K(y, y) - 2 mean K(x, y),
  its gradient w.r.t. x [b, F])."""
  b = len(x)
  kxx, gxx = kernel(x, x)
  kyy, _ = kernel(y, y)
  kxy, gxy = kernel(x, y)
  value = (kxx.sum() + kyy.sum() - 2 * kxy.sum()) / b ** 2
  return value, 2 * (gxx.sum(axis=1) - gxy.sum(axis=1)) / b ** 2


def logits(params: dict, x: np.ndarray, c: np.ndarray, noise: np.ndarray) -> np.ndarray:
  """FedCP's logits [b, C]: head_p(h m_p) + head_g(h m_g)."""
  h, _ = body_forward(params, x)
  personal, global_ = masks(policy_forward(params, h * c)[0], noise)
  return ((h * personal) @ params["head/kernel"] + params["head/bias"]
          + (h * global_) @ params[GLOBAL + "kernel"] + params[GLOBAL + "bias"])


def objective(params: dict, x, y, c, noise, lam: float, frozen: dict):
  """(CE, CE + lam MMD^2(h, h_0), the latter's gradients w.r.t. body, personal head and CPN)
  on a minibatch x [b, ...], y [b] with context c [F], noise [b, 2, F] and the frozen
  body `frozen` (h_0 its features)."""
  h, body_cache = body_forward(params, x)
  u = h * c
  scores, policy_cache = policy_forward(params, u)
  personal, global_ = masks(scores, noise)
  h_p, h_g = h * personal, h * global_
  out = (h_p @ params["head/kernel"] + params["head/bias"]
         + h_g @ params[GLOBAL + "kernel"] + params[GLOBAL + "bias"])
  ce = ref.cross_entropy(out, y)
  h_0, _ = body_forward(frozen, x)
  alignment, dh_mmd = mmd(h, h_0)
  b = len(y)
  dout = ref.softmax(out)
  dout[np.arange(b), y] -= 1.0
  dout /= b
  grads = {"head/kernel": h_p.T @ dout, "head/bias": dout.sum(axis=0)}
  dh_p, dh_g = dout @ params["head/kernel"].T, dout @ params[GLOBAL + "kernel"].T
  dpersonal = (dh_p - dh_g) * h  # the global mask is 1 - the personal one
  dt = dpersonal * personal * global_  # d sigmoid(t_p - t_g) / d t_p; minus for t_g
  policy_grads, du = policy_backward(params, policy_cache, np.stack([dt, -dt], axis=1))
  dh = dh_p * personal + dh_g * global_ + du * c + lam * dh_mmd
  return ce, ce + lam * alignment, {**grads, **policy_grads,
                                    **body_backward(params, body_cache, dh)}


# -- rounds and evaluation -----------------------------------------------------------------
def step_keys(key, count: int, size: int, epochs: int, batch_size: int) -> list:
  """The keys of the real steps (those whose first position is below count) of one
  `sgd_epochs` call with `key`, in order."""
  steps = math.ceil(size / batch_size)
  keys = []
  for epoch_key in jax.random.split(key, epochs):
    _, key_steps = jax.random.split(epoch_key)
    keys += [k for s, k in enumerate(jax.random.split(key_steps, steps))
             if s * batch_size < count]
  return keys


def noise(key, rows: int, features: int) -> np.ndarray:
  """Gumbel noise [rows, 2, F] of a forward pass with key `key` (its mask key: split[0])."""
  return np.asarray(jax.random.gumbel(jax.random.split(key)[0], (rows, 2, features)),
                    np.float64)


def client(shared: dict, personal: dict, x, y, count: int, key, hp, *, epochs: int,
           batch_size: int, fedcp_lambda: float):
  """(what the client sends, its new personal head, its mean CE): SGD (`ref.sgd`) of body,
  personal head and CPN on CE + fedcp_lambda MMD^2 from the server's body, global head and
  CPN and its own head, with its context from its head before training; it sends the body,
  the CPN and 0.5 head + 0.5 global head."""
  frozen = {p: v for p, v in shared.items() if p.startswith("body/")}
  c = context(personal["head/kernel"])
  keys = iter(step_keys(key, count, len(y), epochs, batch_size))

  def grad_fn(params, xb, yb):
    ce, _, grads = objective(params, xb, yb, c, noise(next(keys), batch_size, len(c))[
        :len(yb)], fedcp_lambda, frozen)
    return ce, grads

  params = {**shared, **personal}
  trainable = [p for p in params if not p.startswith(GLOBAL)]
  trained, loss = ref.sgd(params, trainable, grad_fn, x, y, count, key, hp, epochs,
                          batch_size)
  sent = {p: v for p, v in trained.items() if p.startswith(("body/", "cpn/"))}
  sent.update({GLOBAL + p.removeprefix("head/"): 0.5 * trained[p]
               + 0.5 * shared[GLOBAL + p.removeprefix("head/")] for p in personal})
  return sent, {p: trained[p] for p in personal}, loss


def masked_round(shared: dict, personal: list[dict], key, data, hp, clients, mask=None, *,
                 local_epochs: int, batch_size: int, fedcp_lambda: float):
  """One round: (shared, personal, train_loss), as nn_reference.masked_round: clients with
  mask True train (`client`, key fold_in(key, i)), the server takes the count-weighted mean
  of what they sent, they keep their new heads; train_loss the count-weighted mean CE."""
  def one(own, x, y, count, client_key):
    return client(shared, own, x, y, count, client_key, hp, epochs=local_epochs,
                  batch_size=batch_size, fedcp_lambda=fedcp_lambda)

  sent, counts, new_personal, loss = ref.train_cohort(one, personal, key, data, clients, mask)
  return ref.server_update(shared, sent, counts, data.num_clients), new_personal, loss


def test_logits(shared: dict, personal: dict, data, i: int, eval_key) -> np.ndarray:
  """Client i's logits [t, C] of its padded test rows with its params and context."""
  params = {**shared, **personal}
  key = jax.random.fold_in(jax.random.wrap_key_data(jnp.asarray(eval_key)), i)
  x = np.asarray(data.x_test[i], np.float64)
  c = context(personal["head/kernel"])
  return logits(params, x, c, noise(key, len(x), len(c)))


def evaluate(shared: dict, personal: list[dict], data, eval_key) -> dict:
  """test_accuracy and test_accuracy_std (ddof 0) over the clients with test samples of the
  accuracy on their first test_counts[i] test rows of `test_logits`."""
  accuracies = []
  for i in range(len(personal)):
    t = int(data.test_counts[i])
    if t:
      out = test_logits(shared, personal[i], data, i, eval_key)[:t]
      accuracies.append(float(np.mean(out.argmax(axis=1) == np.asarray(data.y_test[i][:t]))))
  return {"test_accuracy": float(np.mean(accuracies)),
          "test_accuracy_std": float(np.std(accuracies))}
