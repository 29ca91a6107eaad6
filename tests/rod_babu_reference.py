"""Independent numpy reference of FedRoD's and FedBABU's rounds and evaluation for an MLP,
written plainly from the papers and PFLlib's clientrod.py / clientbabu.py: float64, a
Python loop over clients, hand-written gradients, nn_reference's MLP, SGD and keys.

FedRoD: params {model (body + generic head), 'personal/head/kernel', 'personal/head/bias'};
a minibatch step moves the model along the gradient of the balanced softmax
CE(g + log n, y) (n: the client's class counts, log 0 = -inf for an absent class) and the
personal head along that of CE(g + p, y) with g and the features h held fixed (PFLlib's
detach); the loss reported is CE(g + p, y). The server averages the models. A client is
tested with the logits g + p.

FedBABU: the body trains with the head frozen; the server averages the bodies and keeps
its head. A client is tested after ft_epochs of SGD from the server's model on its train
data (all params, or the head alone) with key fold_in(wrap_key_data(eval_key), i).
"""

import jax
import jax.numpy as jnp
import numpy as np

import nn_reference as ref

PERSONAL = "personal/"


def one_hot(y: np.ndarray, num_classes: int) -> np.ndarray:
  return np.eye(num_classes)[y]


def balanced_loss_and_grads(model: dict, x, y, counts: np.ndarray):
  """(mean over the b rows of CE(logits + log counts, y), its gradient over the model's
  params), logits = ref.forward(model, x); counts [C] (0 for absent classes)."""
  logits, cache = ref.forward(model, x)
  with np.errstate(divide="ignore"):
    shifted = logits + np.log(counts)
  dlogits = (ref.softmax(shifted) - one_hot(y, logits.shape[1])) / len(y)
  return ref.cross_entropy(shifted, y), ref.backward(model, cache, dlogits)


def personal_head(personal: dict) -> dict:
  return {p.removeprefix(PERSONAL): v for p, v in personal.items()}


def rod_logits(model: dict, personal: dict, x) -> np.ndarray:
  """FedRoD's logits g + p [b, C] of inputs x: the generic model's plus the personal
  head's on the same features."""
  logits, cache = ref.forward(model, x)
  head, h = personal_head(personal), cache[-1][1]
  return logits + h @ head["head/kernel"] + head["head/bias"]


def personal_loss_and_grads(model: dict, personal: dict, x, y):
  """(mean CE(g + p, y), its gradient over the personal head's params, g and h fixed)."""
  logits = rod_logits(model, personal, x)
  _, cache = ref.forward(model, x)
  h = cache[-1][1]
  dlogits = (ref.softmax(logits) - one_hot(y, logits.shape[1])) / len(y)
  return ref.cross_entropy(logits, y), {PERSONAL + "head/kernel": h.T @ dlogits,
                                        PERSONAL + "head/bias": dlogits.sum(axis=0)}


def split_rod(params: dict):
  """(model, personal head) of FedRoD's joint params."""
  return ({p: v for p, v in params.items() if not p.startswith(PERSONAL)},
          {p: v for p, v in params.items() if p.startswith(PERSONAL)})


def fedrod_client(shared, personal, x, y, count, key, hp, *, epochs, batch_size):
  """(model sent, personal head kept, mean loss) of a FedRoD client: epochs of `ref.sgd` on
  model and personal head at once, each step's gradient the balanced softmax's (model)
  and the personalised CE's (personal head), its loss the personalised CE."""
  counts = np.bincount(y[:count], minlength=shared["head/bias"].shape[0]).astype(np.float64)

  def grad_fn(params, xb, yb):
    model, own = split_rod(params)
    _, model_grads = balanced_loss_and_grads(model, xb, yb, counts)
    loss, own_grads = personal_loss_and_grads(model, own, xb, yb)
    return loss, {**model_grads, **own_grads}

  params = {**shared, **personal}
  trained, loss = ref.sgd(params, list(params), grad_fn, x, y, count, key, hp, epochs,
                          batch_size)
  return (*split_rod(trained), loss)


def fedbabu_client(shared, personal, x, y, count, key, hp, *, epochs, batch_size):
  """(body sent, {} kept, mean loss) of a FedBABU client: epochs of SGD on the body's
  params, the head frozen."""
  trained, loss = ref.sgd_epochs(shared, ref.body_names(shared), x, y, count, key, hp, epochs,
                                 batch_size)
  return {p: trained[p] for p in ref.body_names(shared)}, dict(personal), loss


CLIENTS = {"fedrod": fedrod_client, "fedbabu": fedbabu_client}


def masked_round(name: str, shared: dict, personal: list[dict], key, data, hp, clients,
                 mask=None, *, local_epochs: int = 1, batch_size: int = 10):
  """One round of `name` ('fedrod' or 'fedbabu'): (shared, personal, train_loss), as
  `ref.masked_round`: clients where mask is True train with key fold_in(key, i), the
  server count-averages what they sent (FedBABU: the bodies; its head is kept), the
  train_loss is the count-weighted mean of their losses (0 if none)."""
  def one(own, x, y, count, client_key):
    return CLIENTS[name](shared, own, x, y, count, client_key, hp, epochs=local_epochs,
                         batch_size=batch_size)

  sent, counts, new_personal, loss = ref.train_cohort(one, personal, key, data, clients, mask)
  averaged = ref.server_update({p: shared[p] for p in sent[0]} if sent else {}, sent, counts,
                               data.num_clients)
  return {**shared, **averaged}, new_personal, loss


def fine_tuned(shared: dict, data, i: int, hp, *, ft_epochs: int, ft_body: bool, eval_key,
               batch_size: int) -> dict:
  """FedBABU's params of client i at test time: ft_epochs of SGD from the server's model on
  its train data, on all params (ft_body) or the head's."""
  key = jax.random.fold_in(jax.random.wrap_key_data(jnp.asarray(eval_key)), i)
  trainable = list(shared) if ft_body else ref.head_names(shared)
  params, _ = ref.sgd_epochs(shared, trainable, np.asarray(data.x[i], np.float64),
                             np.asarray(data.y[i]), int(data.counts[i]), key, hp, ft_epochs,
                             batch_size)
  return params


def evaluate(name: str, shared: dict, personal: list[dict], data, hp=None, **ft) -> dict:
  """test_accuracy and test_accuracy_std (ddof 0) over the clients with test samples of each
  one's accuracy on its first test_counts[i] test rows: FedRoD's with the logits g + p,
  FedBABU's with its `fine_tuned` params (`ft`: fine_tuned's keywords)."""
  accuracies = []
  for i in range(len(personal)):
    t = int(data.test_counts[i])
    if not t:
      continue
    x, y = np.asarray(data.x_test[i][:t], np.float64), np.asarray(data.y_test[i][:t])
    if name == "fedrod":
      logits = rod_logits(shared, personal[i], x)
    else:
      logits, _ = ref.forward(fine_tuned(shared, data, i, hp, **ft), x)
    accuracies.append(float(np.mean(np.argmax(logits, axis=1) == y)))
  return {"test_accuracy": float(np.mean(accuracies)),
          "test_accuracy_std": float(np.std(accuracies))}
