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
  count-weighted mean), its sums formed by `cohort_sum`.

With `devices` set, the round runs with the client axis sharded over that many devices
(`shard_map` over `core.sharding.client_mesh`): device d holds the contiguous shard
[d n/D, (d+1) n/D) of the clients' data and personal params, the shared params are
replicated, the cohort is drawn stratified over `cohort_groups` contiguous groups of
clients (`cohort.sample_grouped`), each device drawing, training (the local vmap over
client groups) and updating only its own groups' clients, and the server's weighted sums
are combined by one `psum` over the devices (`cohort_sum`). The groups, not the devices,
fix the cohorts, so any device count that divides `cohort_groups` gives the numbers of
devices=None with the same `cohort_groups` (up to float32 summation order).
"""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import NamedSharding, PartitionSpec
from optax import tree_utils as otu

from fedjax_rep.core import aggregate
from fedjax_rep.core import checks
from fedjax_rep.core import cohort as cohort_lib
from fedjax_rep.core import sharding
from fedjax_rep.core import struct
from fedjax_rep.core import tree
from fedjax_rep.nn import conventions
from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import train
from fedjax_rep.nn.hparams import NNHparams


@struct.dataclass
class NNState:
  """shared: flat params kept by the server (once); personal: flat params kept by the
  clients, each [n, ...] (sampled or not, a client keeps its own across rounds);
  eval_key: uint32 key data of the randomness of evaluation (fine-tuning shuffles);
  untrained: bool [n], the clients that have not trained yet, kept only with the option
  `average_untrained` (`conventions`' starting_heads; None otherwise); cohort: bool [n],
  the clients that trained in the last round, kept only with eval_clients="cohort" (None
  otherwise)."""
  shared: dict
  personal: dict
  eval_key: jax.Array
  untrained: jax.Array | None = None
  cohort: jax.Array | None = None


# Leading (client) axis split over the client mesh's devices; how an NNState lies on the mesh
# (personal params split by client, the rest replicated: a pytree prefix, as shard_map takes).
BY_CLIENT = PartitionSpec(sharding.CLIENTS)
STATE_SPECS = NNState(shared=PartitionSpec(), personal=BY_CLIENT, eval_key=PartitionSpec(),
                      untrained=BY_CLIENT, cohort=BY_CLIENT)
AVERAGE_UNTRAINED = conventions.OPTIONS["starting_heads"]
# Whom `evaluate` tests: every client (FedRep's code, the default), or the last round's cohort.
EVAL_CLIENTS = ("all", "cohort")
UNIFORM_AVERAGE = conventions.OPTIONS["averaging"]


@dataclasses.dataclass(frozen=True)
class Personalized:
  """Base of the neural algorithms (see the module docstring).

  model: a `models.Classifier` (params {'body', 'head'}); cohort: clients per round;
  local_epochs: epochs of local training (FedRep: of the body, after its head epochs);
  batch_size: minibatch size; client_group: clients trained together
  in one vmap (the groups run one after another; None: the whole cohort at once);
  cohort_groups: draw the cohort stratified over this many contiguous equal groups of
  clients, cohort/cohort_groups from each (`cohort.sample_grouped`; None: uniformly from
  all clients, or one group per device when sharded); devices: run rounds and evaluation
  with the client axis sharded over the first `devices` devices (the module docstring;
  None: unsharded). num_clients and cohort must be multiples of cohort_groups, and
  cohort_groups of devices. eval_clients: whom `evaluate` tests, every client ("all", as
  FedRep's code) or only those that trained in the last round ("cohort").
  """
  model: nn.Module
  cohort: int
  local_epochs: int = 1
  batch_size: int = 10
  client_group: int | None = 10
  name: str = "personalized"
  cohort_groups: int | None = None
  devices: int | None = None
  eval_clients: str = "all"
  # Whether the option `average_untrained` (`conventions`' starting_heads) applies: the
  # algorithms whose authors' code lets untrained clients alias the global model.
  averages_untrained: ClassVar[bool] = False
  # Compile the loop's programs for compile time on the CPU (`core.loop.QUICK_COMPILE`).
  quick_compile: ClassVar[bool] = True
  # The metric the loop's blow-up bound watches (`core.protocols.Algorithm`): train_loss.
  tracked_metric: ClassVar[str | None] = None

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
  def sgd(self, loss_fn, params, x, y, count, key, hparams, epochs: int, **traced):
    """`train.sgd_epochs` with this algorithm's batch size (`traced`: its `active` and
    `trainable`)."""
    return train.sgd_epochs(loss_fn, params, x, y, count, key, hparams, epochs=epochs,
                            batch_size=self.batch_size, **traced)

  def train_head(self, body: dict, head: dict, x, y, count, key, hparams, epochs: int,
                 **traced):
    """(head, mean loss) after `epochs` of SGD on the head alone (`traced`: as `sgd`'s). The
    body is frozen, so its features are computed once (one forward pass, not one per
    epoch)."""
    h = self.features(body, x)
    loss = lambda p, hb, yb, wb, k: train.cross_entropy(self.head_logits(p, hb, k), yb, wb)
    return self.sgd(loss, head, h, y, count, key, hparams, epochs, **traced)

  def head_trained(self, flat: dict, x, y, count, key, hparams, epochs: int, active=None):
    """flat (params) with its head trained for `epochs` epochs on the frozen body's features
    (`train_head`); with `active` (int []), only the first `active` of them, and nothing
    (not even the features) where it is 0."""
    body, head = params_lib.split(flat, params_lib.head_personal(flat))

    def train():
      return self.train_head(body, head, x, y, count, key, hparams, epochs, active=active)[0]

    return params_lib.merge(body, train() if active is None else
                            jax.lax.cond(active > 0, train, lambda: head))

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

  def check(self, data, hparams: NNHparams) -> None:
    """The checks of a run, before anything compiles (`core.checks`): the data's own
    (`ClientDatasets.check`, with labels below the classes the model's head outputs too),
    1 <= cohort <= num_clients, the sharding (`check_sharding`), eval_clients one of
    EVAL_CLIENTS, and the option `average_untrained` only where it applies
    (`averages_untrained`)."""
    if AVERAGE_UNTRAINED in hparams.options and not self.averages_untrained:
      raise ValueError(f"{self.name}: the option {AVERAGE_UNTRAINED} (starting_heads="
                       f"averaged) applies to FedRep, FedPer, LG-FedAvg and FLUTE, whose "
                       f"authors' code has it; leave it out for {self.name}")
    data.check(min(data.num_classes, getattr(self.model, "num_classes", data.num_classes)))
    checks.in_range("cohort", self.cohort, 1, data.num_clients, "the number of clients",
                    "sample at most that many clients per round")
    if self.eval_clients not in EVAL_CLIENTS:
      raise ValueError(f"eval_clients={self.eval_clients!r} must be one of {EVAL_CLIENTS}: "
                       f"evaluate every client or the last round's cohort")
    self.check_sharding(data.num_clients)

  def init(self, key, data, hparams: NNHparams) -> NNState:
    """The model's initial params (one draw: every client starts from the same model),
    every client untrained where the option `average_untrained` is given, and no client in
    the last cohort with eval_clients="cohort"; when sharded, laid out as STATE_SPECS says
    on the client mesh."""
    self.check_sharding(data.num_clients)
    key_model, key_eval = jax.random.split(key)
    sample = jnp.zeros((1, *data.x.shape[2:]), data.x.dtype)
    flat = params_lib.flatten(self.model.init(key_model, sample)["params"])
    shared, personal = self.initial_parts(flat)
    personal = jax.tree.map(lambda p: jnp.broadcast_to(p, (data.num_clients, *p.shape)),
                            personal)
    untrained = (jnp.ones(data.num_clients, bool) if AVERAGE_UNTRAINED in hparams.options
                 else None)
    cohort = jnp.zeros(data.num_clients, bool) if self.eval_clients == "cohort" else None
    state = NNState(shared=shared, personal=personal, eval_key=jax.random.key_data(key_eval),
                    untrained=untrained, cohort=cohort)
    if self.devices is None:
      return state
    mesh = sharding.client_mesh(self.devices)
    return jax.lax.with_sharding_constraint(state, jax.tree.map(
        lambda spec: NamedSharding(mesh, spec), STATE_SPECS,
        is_leaf=lambda x: isinstance(x, PartitionSpec)))

  def round(self, state: NNState, key, data, hparams: NNHparams):
    """One round: the cohort drawn from `key` (uniformly, or stratified over the cohort
    groups) trains and the server updates (`masked_round`). Sharded, two shard_maps: each
    device draws its own groups' part of the cohort and trains it (`train_clients`), then
    the server's step (`server_step`) sums over the devices and must leave the shared
    params and metrics the same on all of them (a ValueError otherwise: SCAFFOLD's control
    variates are summed without `cohort_sum`)."""
    self.check_sharding(data.num_clients)
    key_cohort, key_clients = jax.random.split(key)
    num_clients, groups = data.num_clients, self.num_cohort_groups()
    if self.devices is None:
      clients = (cohort_lib.sample_cohort(key_cohort, num_clients, self.cohort)
                 if groups is None else
                 cohort_lib.sample_grouped(key_cohort, num_clients, self.cohort, groups))
      return self.masked_round(state, key_clients, data, hparams, clients)

    def local(state, data):  # this device's clients: offset + range(data.num_clients)
      offset = device_offset(data.num_clients)
      group_ids = offset // (num_clients // groups) + jnp.arange(groups // self.devices)
      clients = cohort_lib.sample_grouped(key_cohort, num_clients, self.cohort, groups,
                                          group_ids)
      return (*self.train_clients(state, key_clients, data, hparams, clients - offset,
                                  clients), clients)

    def server(shared, sent, weights, losses):
      return self.server_step(shared, sent, weights, losses, num_clients)

    mesh = sharding.client_mesh(self.devices)
    # check_vma off for training: its scans start from replicated carries (SGD's params,
    # loss totals) that become per-device, which JAX's varying-axes types would reject.
    state, sent, weights, losses, clients = jax.shard_map(
        local, mesh=mesh, in_specs=(STATE_SPECS, BY_CLIENT),
        out_specs=(STATE_SPECS, BY_CLIENT, BY_CLIENT, BY_CLIENT, BY_CLIENT),
        check_vma=False)(state, data)
    try:  # check_vma on: JAX proves the server's outputs the same on every device
      shared, metrics = jax.shard_map(
          server, mesh=mesh, in_specs=(PartitionSpec(), BY_CLIENT, BY_CLIENT, BY_CLIENT),
          out_specs=(PartitionSpec(), PartitionSpec()))(state.shared, sent, weights, losses)
    except ValueError as error:  # JAX's message: out_specs "require replication" ...
      if "replicat" not in str(error):
        raise
      raise ValueError(f"{self.name} cannot run sharded (devices={self.devices}): its server "
                       f"step combines the cohort's values without `cohort_sum` (a psum over "
                       f"the devices), so the devices would disagree on the shared params; "
                       f"use devices=None") from error
    state = self.start_untrained(state.replace(shared=shared), clients, weights, None, hparams)
    return self.record_cohort(state, clients, None), metrics

  def masked_round(self, state: NNState, key, data, hparams: NNHparams, clients, mask=None):
    """One round of clients `clients` [c] where `mask` [c] (bool; None: all) is True: they
    train (client i with key fold_in(key, i)), the server averages their shared params
    weighted by their sample counts, and they keep their new personal params; masked and
    unsampled clients keep theirs (`start_untrained`: with the option average_untrained,
    those that have not trained yet take the cohort's mean). Metrics: train_loss
    (count-weighted mean over the cohort of each client's mean minibatch loss). The weights
    are uniform instead of sample counts with the option uniform_average
    (`client_weights`). On one device (with `devices` set, use `round`: each device draws
    its own part of the cohort)."""
    if self.devices is not None:
      raise ValueError(f"{self.name}: masked_round trains given clients on one device; with "
                       f"devices={self.devices} use round")
    state, sent, weights, losses = self.train_clients(state, key, data, hparams, clients,
                                                      clients, mask)
    shared, metrics = self.server_step(state.shared, sent, weights, losses, data.num_clients)
    state = self.start_untrained(state.replace(shared=shared), clients, weights, mask, hparams)
    return self.record_cohort(state, clients, mask), metrics

  def train_clients(self, state: NNState, key, data, hparams: NNHparams, rows, clients,
                    mask=None):
    """Local training of the clients at rows `rows` [c] of `data` and `state.personal`,
    whose global indices are `clients` [c] (the same unless sharded; client i trains with
    key fold_in(key, i)), where `mask` [c] (bool; None: all) is True. Returns (state with
    their new personal params (masked and unsampled clients keep theirs), what they send
    (`client_update`'s shared output, leaves [c, ...]), their weights [c] (sample counts,
    0 where masked; `client_weights`), their mean minibatch losses [c])."""
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, clients)
    old_personal = tree.gather(state.personal, rows)

    def client(args):  # fetches its own data: the cohort's is never copied out as a whole
      personal, row, client_key = args
      x, y, count = jax.tree.map(lambda a: a[0], data.batch(key, row[None]))
      return self.client_update(state.shared, personal, x, y, count, client_key, hparams)

    sent, personal, losses = train.client_map(client, (old_personal, rows, keys),
                                              self.client_group)
    weights = self.client_weights(data, rows, hparams, mask)
    if mask is not None:
      personal = jax.tree.map(
          lambda new, old: jnp.where(mask.reshape(-1, *[1] * (new.ndim - 1)), new, old),
          personal, old_personal)
    state = state.replace(personal=tree.scatter(state.personal, rows, personal))
    return state, sent, weights, losses

  def client_weights(self, data, rows, hparams: NNHparams, mask=None) -> jax.Array:
    """The server's weights [c] of the clients at rows `rows` [c] of `data`: their sample
    counts, or 1 each with the option uniform_average (the authors' codes on CIFAR); 0
    where `mask` [c] (bool; None: all) is False."""
    weights = data.sample_counts(rows)
    uniform = hparams.options.get(UNIFORM_AVERAGE)
    if uniform is not None:
      weights = jnp.where(uniform > 0, jnp.ones_like(weights), weights)
    return weights if mask is None else jnp.where(mask, weights, 0.0)

  def start_untrained(self, state: NNState, clients, weights, mask, hparams: NNHparams):
    """After a round of clients `clients` [c] (those where `mask` [c] is True trained;
    None: all) with the server's weights [c]: with the option average_untrained set to 1,
    every client that has not trained yet takes as its personal params their mean over
    the clients that trained (weighted by `weights`; nothing where the weights sum to 0),
    as in the authors' code, where such a client's personal params are the global
    model's, which the server overwrites with its averages of every parameter. `state`
    unchanged without the option."""
    flag = hparams.options.get(AVERAGE_UNTRAINED)
    if flag is None:
      return state
    trained = jnp.ones(clients.shape, bool) if mask is None else mask
    untrained = state.untrained.at[clients].set(state.untrained[clients] & ~trained)
    sums, total = aggregate.weighted_sum(tree.gather(state.personal, clients), weights)
    start = untrained & (flag > 0) & (total > 0) & self.shares_params(hparams)
    personal = jax.tree.map(
        lambda p, s: jnp.where(start.reshape(-1, *[1] * (p.ndim - 1)), s, p),
        state.personal, aggregate.mean(sums, total))
    return state.replace(personal=personal, untrained=untrained)

  def record_cohort(self, state: NNState, clients, mask) -> NNState:
    """`state` with `cohort` [n] True exactly at the clients `clients` [c] that trained
    this round (where `mask` [c] is True; None: all); unchanged where it keeps no cohort."""
    if state.cohort is None:
      return state
    trained = jnp.ones(clients.shape, bool) if mask is None else mask
    return state.replace(cohort=jnp.zeros_like(state.cohort).at[clients].max(trained))

  def shares_params(self, hparams: NNHparams):
    """Whether the server averages any parameter (bool or bool [])."""
    del hparams
    return True

  def server_step(self, shared: dict, sent: dict, weights: jax.Array, losses: jax.Array,
                  num_clients: int):
    """(the server's new shared params (`server_update`), metrics: train_loss, the
    `weights`-weighted mean of the cohort's losses [c]) from what the cohort sent."""
    shared = self.server_update(shared, sent, weights, num_clients)
    return shared, {"train_loss": aggregate.mean(*self.cohort_sum(losses, weights))}

  def server_update(self, shared: dict, sent: dict, weights: jax.Array, num_clients: int):
    """The server's new shared params from what the cohort sent (`sent`: each client's
    `client_update` shared output, leaves [c, ...]) with weights [c] (sample counts, 0
    for masked clients) out of num_clients: the weighted mean (unchanged if no weight)."""
    del num_clients
    sums, total = self.cohort_sum(sent, weights)
    return otu.tree_where(total > 0, aggregate.mean(sums, total), shared)

  def cohort_sum(self, values, weights: jax.Array):
    """(sum_i w_i u_i, sum_i w_i) over the whole cohort (`aggregate.weighted_sum`): values a
    pytree of leaves [c, ...], weights [c]. Sharded, each device holds its part of the
    cohort and the sums are psum'd over the devices, so every device gets the total."""
    sums = aggregate.weighted_sum(values, weights)
    return sums if self.devices is None else jax.lax.psum(sums, sharding.CLIENTS)

  # -- sharding ----------------------------------------------------------------------------
  def num_cohort_groups(self) -> int | None:
    """The cohort's groups: cohort_groups, else one per device (None: unstratified)."""
    return self.cohort_groups if self.cohort_groups is not None else self.devices

  def check_sharding(self, num_clients: int) -> None:
    """Raises ValueError unless `devices` and `cohort_groups` are None or integers >= 1
    that fit: devices at most the devices JAX sees, cohort_groups a multiple of devices,
    num_clients and cohort multiples of cohort_groups, and this algorithm's round
    shardable (not one that adds steps to `masked_round`). init, round and evaluate call
    it first, before any work."""
    for name, value in (("devices", self.devices), ("cohort_groups", self.cohort_groups)):
      if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                or value < 1):
        raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")
    groups = self.num_cohort_groups()
    if self.devices is not None:
      mesh = sharding.client_mesh(self.devices)
      if self.sharding_refusal() is not None:
        raise ValueError(f"{self.name} cannot run sharded (devices={self.devices}): "
                         f"{self.sharding_refusal()}; use devices=None")
      if groups % self.devices:
        raise ValueError(f"cohort_groups={groups} must be a multiple of devices="
                         f"{self.devices} (every device holds the same number of groups)")
      sharding.check_divisible(num_clients, mesh)
    if groups is not None and (num_clients % groups or self.cohort % groups):
      raise ValueError(f"num_clients={num_clients} and cohort={self.cohort} must be "
                       f"multiples of the cohort groups ({groups}): each group holds "
                       f"num_clients/{groups} clients and draws cohort/{groups} of them")

  def sharding_refusal(self) -> str | None:
    """Why this algorithm's round cannot shard (None: it can): a `masked_round` that adds
    steps over the whole cohort."""
    if type(self).masked_round is not Personalized.masked_round:
      return "its masked_round adds steps over the whole cohort"
    return None

  def eval_params(self, shared: dict, personal: dict, x, y, count, key, hparams) -> dict:
    """The flat params a client is tested with (default: shared + its personal ones)."""
    del x, y, count, key, hparams
    return params_lib.merge(shared, personal)

  def evaluate(self, state: NNState, data, hparams: NNHparams) -> dict:
    """Every client tested on its own test set with its own params (`eval_params`):
    `accuracy_metrics` over all clients, or with eval_clients="cohort" over the last
    round's cohort (those without test samples left out). Sharded, each device tests the
    clients it holds (one shard_map)."""
    self.check_sharding(data.num_clients)
    test_counts = (data.test_counts if state.cohort is None
                   else jnp.where(state.cohort, data.test_counts, 0))

    def tested(state, data, offset):  # `train.tested` [n'] of the clients offset + range(n')
      keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
          jax.random.wrap_key_data(state.eval_key), offset + jnp.arange(data.num_clients))

      def client(args):
        personal, x, y, count, key, x_test, y_test, test_count = args
        flat = self.eval_params(state.shared, personal, x, y, count, key, hparams)
        return train.tested(self.logits(flat, x_test), y_test, test_count)

      return train.client_map(client, (state.personal, data.x, data.y, data.counts, keys,
                                       data.x_test, data.y_test, data.test_counts),
                              self.client_group)

    if self.devices is None:
      return accuracy_metrics(*tested(state, data, 0), test_counts)

    def local(state, data):
      return tested(state, data, device_offset(data.num_clients))

    return accuracy_metrics(*jax.shard_map(  # check_vma off: fine-tuning's scans (see round)
        local, mesh=sharding.client_mesh(self.devices), in_specs=(STATE_SPECS, BY_CLIENT),
        out_specs=BY_CLIENT, check_vma=False)(state, data), test_counts)

  def new_clients(self, state: NNState, data, hparams: NNHparams, key, epochs: int) -> dict:
    """`accuracy_metrics` of new clients (`data`: their own train and test sets) that reuse
    the learned body (the server's) and fit only a head, from zero, by `epochs` epochs of
    SGD on their training data (FedRep Fig. 4's question, for neural nets)."""
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
      return train.tested(self.logits(params_lib.merge(body, new_head), x_test), y_test,
                          test_count)

    return accuracy_metrics(*train.client_map(
        client, (data.x, data.y, data.counts, keys, data.x_test, data.y_test, data.test_counts),
        self.client_group), data.test_counts)


def accuracy_metrics(accuracies: jax.Array, hits: jax.Array, test_counts: jax.Array) -> dict:
  """The evaluation of n clients of accuracies [n] that got hits [n] (int) of their
  test_counts [n] test samples right (`train.tested`). A client without test samples (or
  whose test_counts are set to 0: not evaluated) is left out of every metric:

  test_accuracy: the mean over the tested clients (test_counts > 0) of their accuracies
    hits / test_counts; test_accuracy_weighted: sum(hits) / sum(test_counts) (the accuracy
    over all test samples); test_accuracy_std: the std (ddof 0) of the tested clients'
    accuracies; test_accuracy_p10: their 10th percentile (linear interpolation, as
    np.percentile: the worst decile's edge); test_clients: how many were tested (int32).
  The accuracies are NaN where no client has test samples. With every client tested, the
  mean and std are jnp.mean and jnp.std of all: XLA sums masked values in another order,
  and this keeps the float32 values of the runs made before clients could be left out.
  """
  tested = test_counts > 0
  clients = jnp.sum(tested, dtype=jnp.int32)
  everyone = clients == accuracies.shape[0]
  mean = jnp.sum(jnp.where(tested, accuracies, 0.0)) / clients
  variance = jnp.sum(jnp.where(tested, jnp.square(accuracies - mean), 0.0)) / clients
  return {"test_accuracy": jnp.where(everyone, jnp.mean(accuracies), mean),
          "test_accuracy_weighted": jnp.sum(jnp.where(tested, hits, 0)) / jnp.sum(test_counts),
          "test_accuracy_std": jnp.where(everyone, jnp.std(accuracies), jnp.sqrt(variance)),
          "test_accuracy_p10": jnp.nanpercentile(jnp.where(tested, accuracies, jnp.nan), 10),
          "test_clients": clients}


def device_offset(held: int) -> jax.Array:
  """The global index [] of the first client of this device, inside a shard_map over the
  client mesh whose devices hold `held` clients each."""
  return jax.lax.axis_index(sharding.CLIENTS) * held
