"""FedRep with the client axis over 8 emulated CPU devices gives the 1-device numbers.

XLA_FLAGS=--xla_force_host_platform_device_count=8 must be set before JAX starts, so the
8-device run happens in a subprocess (this module's `results`), compared here with the
same configurations on this process's single device.
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.native import build
from conftest import emulated_devices_env

N, M, D, K = 64, 5, 6, 2
DEVICES, GROUPS, BLOCK = 8, 8, 3
HP = fr.LinearHparams(lr=jnp.float32(0.1), head_lr=jnp.float32(0.05))
CASES = [(mode, cohort, head_steps) for mode in ("fixed", "fresh", "fresh-statistics")
         for cohort, head_steps in ((N, None), (16, 1))]
# With the C++ rounds (FedRep(kernel="native")) where there is a compiler to build them.
QUICK_CASES = [("fixed", N, None), ("fresh-statistics", 16, 1)] + (
    [("fixed", N, None, "native"), ("fresh-statistics", N, None, "native")]
    if build.has_compiler() else [])
OTHER_CASES = [case for case in CASES if case not in QUICK_CASES]


def data_of(mode):
  problem = fr.make_problem(jax.random.key(0), N, D, K, 0.1)
  if mode == "fixed":
    return fr.make_fixed_data(jax.random.key(1), problem, M)
  return fr.FreshData(problem, M, sampler="statistics" if mode == "fresh-statistics"
                      else "direct")


def results(devices: int, cases) -> dict:
  """B, heads and losses after 3 rounds of every case (mode, cohort, head_steps[, kernel]),
  on `devices` devices."""
  out = {}
  for mode, cohort, head_steps, *kernel in cases:
    algorithm = fr.FedRep(rep_dim=K, cohort=cohort, head_steps=head_steps, block=BLOCK,
                          devices=devices, client_groups=GROUPS, kernel=(kernel or ["xla"])[0])
    result = fr.run(algorithm, data_of(mode), HP, jax.random.key(5), 3, progress=False)
    name = "-".join(map(str, (mode, cohort, *kernel)))
    out[f"{name}-B"] = np.asarray(result.state.B)
    out[f"{name}-heads"] = np.asarray(result.state.heads)
    out[f"{name}-loss"] = result.metrics["train_loss"]
  return out


CHILD = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import jax
import test_linear_sharding as t
assert len(jax.devices()) == t.DEVICES, jax.devices()
np.savez(sys.argv[2], **t.results(t.DEVICES, getattr(t, sys.argv[3])))
try:  # 60 clients do not split over 8 devices: a ValueError before any work
  t.fr.FedRep(rep_dim=t.K, cohort=60, devices=t.DEVICES).init(
      jax.random.key(0), t.data_of("fixed").replace(X=np.zeros((60, t.M, t.D))), t.HP)
  raise SystemExit("no error for 60 clients on 8 devices")
except ValueError as error:
  assert "multiple of the number of devices" in str(error), error
"""


def compare_eight_with_one(tmp_path, cases_name):
  path = tmp_path / "eight.npz"
  done = subprocess.run([sys.executable, "-c", CHILD, os.path.dirname(__file__), str(path),
                         cases_name], env=emulated_devices_env(DEVICES),
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  eight, one = np.load(path), results(1, globals()[cases_name])
  assert set(eight) == set(one)
  for name in one:
    np.testing.assert_allclose(eight[name], one[name], rtol=2e-4, atol=2e-5, err_msg=name)


@pytest.mark.slow
def test_eight_devices_match_one_device(tmp_path):
  """Fixed data with full participation, statistics-sampled fresh data with a grouped
  partial cohort and GD-GD heads."""
  compare_eight_with_one(tmp_path, "QUICK_CASES")


@pytest.mark.slow
def test_eight_devices_match_one_device_in_every_mode(tmp_path):
  """The cases of CASES that test_eight_devices_match_one_device leaves out."""
  compare_eight_with_one(tmp_path, "OTHER_CASES")


RECOMPILE_CHILD = """
import jax, jax.numpy as jnp
import fedjax_rep as fr
chunks = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, duration, **kw: chunks.append(1) if name ==
    "/jax/core/compile/backend_compile_duration" and "_run_chunk" in kw.get("fun_name", "")
    else None)
data = fr.FreshData(fr.make_problem(jax.random.key(0), 64, 6, 2, 0.1), 5)
fr.run(fr.FedRep(rep_dim=2, cohort=64, devices=8), data,
       fr.LinearHparams(lr=jnp.float32(0.1), head_lr=jnp.float32(0.1)), jax.random.key(1), 6,
       chunk=2, progress=False)
print(len(chunks))
"""


@pytest.mark.slow
def test_sharded_run_compiles_its_chunk_once():
  """Three chunks on 8 devices: the chunk program compiles once (the carried `diverged`
  flag starts replicated over the mesh, as the chunks return it)."""
  done = subprocess.run([sys.executable, "-c", RECOMPILE_CHILD], env=emulated_devices_env(8),
                        check=True, capture_output=True, text=True)
  assert done.stdout.strip().splitlines()[-1] == "1"
