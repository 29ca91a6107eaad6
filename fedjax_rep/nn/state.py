"""The state of a neural run and what a round's hooks see besides their data."""

import jax

from fedjax_rep.core import struct


@struct.dataclass
class NNState:
  """shared: flat params kept by the server (once); personal: flat params kept by the
  clients, each [n, ...] (a client keeps its own across rounds); eval_key: uint32 key data
  of evaluation's randomness; server: the server state (`initial_server`, carried by
  `server_update`: momentum buffers, control variates); round: int32 [], the rounds
  completed; untrained: bool [n], the clients that have not trained yet (only with the
  option average_untrained; None otherwise); cohort: bool [n], the clients of the last
  round (only with eval_clients="cohort"; None otherwise)."""
  shared: dict
  personal: dict
  eval_key: jax.Array
  server: dict
  round: jax.Array
  untrained: jax.Array | None = None
  cohort: jax.Array | None = None


@struct.dataclass
class RoundInfo:
  """What the hooks of a round see besides their data: `round` (int32 []: the rounds
  completed before this one, 0 in the first), `server` (the server state, as
  `server_update` left it) and `num_clients` (n, static)."""
  round: jax.Array
  server: dict
  num_clients: int = struct.static_field()
