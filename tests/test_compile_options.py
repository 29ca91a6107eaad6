"""The round loop's compiler options (`core.loop.compiler_options`): on the CPU, the neural
algorithms' programs compile with `QUICK_COMPILE`, the linear ones with XLA's defaults."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.core import loop
from fedjax_rep.core.padding import Padded


def test_neural_algorithms_and_their_wrappers_compile_quickly_on_the_cpu_only():
  neural = fr.make_neural_algorithm("fedrep", model=fr.make_model("digits-mlp", 10), cohort=3)
  linear = fr.make_algorithm("fedrep", rep_dim=2, cohort=3)
  timed = fr.Timed(neural, fr.fixed_speeds(6), cohort=3)
  assert loop.compiler_options(neural, "cpu") == loop.QUICK_COMPILE
  assert loop.compiler_options(Padded(neural), "cpu") == loop.QUICK_COMPILE
  assert loop.compiler_options(timed, "cpu") == loop.QUICK_COMPILE
  for platform in ("gpu", "cuda", "tpu"):
    assert loop.compiler_options(neural, platform) is None
  assert loop.compiler_options(linear, "cpu") is None
  assert loop.compiler_options(Padded(linear), "cpu") is None


# A neural run with its programs compiled as the loop does, then with the algorithm's
# quick_compile off, in a process with XLA's default flags (the suite's conftest sets flags
# that equal QUICK_COMPILE for every program; the child must not inherit them). The two
# compilations round differently somewhere in these 10 rounds (the smallest runs tried gave
# the same bits: 3 rounds of FedRep on 6 clients).
CHILD = textwrap.dedent("""\
    import json, sys
    import jax, numpy as np
    import fedjax_rep as fr
    from fedjax_rep.nn.algorithm import Personalized

    data = jax.tree.map(lambda a: a[:10], fr.digits.federated(40, "classes", 2, seed=0))
    algorithm = fr.make_neural_algorithm("fedavg", model=fr.make_model("digits-mlp", 10),
                                         cohort=5, batch_size=10, client_group=5)
    hp = fr.nn_hparams(lr=0.1, momentum=0.5, weight_decay=1e-3)

    def metrics():
      result = fr.run(algorithm, data, hp, jax.random.key(0), 10, eval_every=10, progress=False)
      values = {**result.metrics, **result.eval_metrics}
      return {name: np.asarray(v, np.float64).tolist() for name, v in sorted(values.items())}

    quick = metrics()
    Personalized.quick_compile = False
    plain = metrics()
    json.dump({"quick": quick, "plain": plain}, sys.stdout)
    """)


@pytest.mark.slow  # two child processes, each compiling a run; the fast tier has no such check
def test_the_options_reach_the_compiled_programs_and_change_only_round_off():
  env = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
  done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                        env={**env, "JAX_PLATFORMS": "cpu"}, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout)
  quick, plain = result["quick"], result["plain"]
  assert quick.keys() == plain.keys() and "train_loss" in quick and "test_accuracy" in quick
  assert quick != plain  # compiled differently: the options were applied
  for name in quick:
    np.testing.assert_allclose(quick[name], plain[name], rtol=1e-5, atol=1e-6, err_msg=name)
