"""A VALID, stride-1 2-D convolution whose lowering is chosen per backend, and a 2x2 max pool.

On XLA:CPU a `jax.vmap` over per-client conv kernels lowers to a grouped convolution,
which runs far slower than the equivalent matmul, and `lax.conv` inside `lax.scan` runs
slower than outside it (see docs/benchmarks.md). Writing the convolution as patches +
matmul (im2col: for a kh x kw kernel, stack the kh*kw shifted slices
x[:, i:i+H', j:j+W', :] along the channel axis in (i, j, c) order, then one matmul with the
kernel reshaped [kh*kw*cin, cout]) avoids both: vmapped over clients it becomes a batched
dot. On GPU, cuDNN runs grouped convolutions well and im2col only costs memory, so 'auto'
keeps `lax.conv_general_dilated` there (and on TPU) and uses im2col elsewhere. Both give
the same numbers and gradients up to float32 rounding.

Max pooling through `reduce_window` has a slow gradient on CPU; a 2x2 pool with stride 2 is
a reshape + max, which differentiates cheaply everywhere.
"""

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.dtypes import promote_dtype

IMPLS = ("auto", "im2col", "xla")


def resolve_impl(impl: str) -> str:
  """'im2col' or 'xla' for `impl`; 'auto' is 'xla' on GPU/TPU and 'im2col' otherwise."""
  if impl not in IMPLS:
    raise ValueError(f"unknown conv impl {impl!r}; expected one of {IMPLS}")
  if impl == "auto":
    return "xla" if jax.default_backend() in ("gpu", "tpu") else "im2col"
  return impl


def conv_im2col(x: jax.Array, kernel: jax.Array, precision=None) -> jax.Array:
  """VALID stride-1 conv [N, H', W', cout] of x [N, H, W, cin] by kernel [kh, kw, cin, cout].

  H' = H - kh + 1, W' = W - kw + 1. Patches [N, H', W', kh*kw*cin] are the shifted slices
  stacked in (i, j, c) order, the row-major order of the kernel's first three axes, so one
  matmul, at `precision` (a `jax.lax.Precision`; None: jax's default), finishes the conv.
  """
  kh, kw, cin, cout = kernel.shape
  h, w = x.shape[1] - kh + 1, x.shape[2] - kw + 1
  patches = jnp.concatenate(
      [x[:, i:i + h, j:j + w, :] for i in range(kh) for j in range(kw)], axis=-1)
  return jnp.matmul(patches, kernel.reshape(kh * kw * cin, cout), precision=precision)


def conv_xla(x: jax.Array, kernel: jax.Array, precision=None) -> jax.Array:
  """The same conv as `conv_im2col`, through `lax.conv_general_dilated` (NHWC, HWIO)."""
  return jax.lax.conv_general_dilated(x, kernel, (1, 1), "VALID",
                                      dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                      precision=precision)


class Conv(nn.Module):
  """VALID stride-1 conv with bias: [..., H, W, cin] -> [..., H-kh+1, W-kw+1, features].

  Params: `kernel` [kh, kw, cin, features] (lecun_normal), `bias` [features] (zeros), always
  float32. `impl` is 'im2col', 'xla' or 'auto' (see the module docstring). `dtype` is the
  computation dtype, as flax's `dtype`: None computes in the inputs' and params' dtype
  (float32); e.g. jnp.bfloat16 casts x, kernel and bias to it, so the conv and its output are
  bfloat16 while the params (and their gradients) stay float32. `precision` is the conv's
  `jax.lax.Precision`, as flax's `precision` (None: jax's default matmul precision, TF32 for
  float32 on recent NVIDIA GPUs; HIGHEST: float32 products on every backend); the
  gradient's convs and matmuls inherit it.
  """
  features: int
  kernel_size: Sequence[int] = (5, 5)
  impl: str = "auto"
  dtype: Any = None
  precision: Any = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    conv = conv_xla if resolve_impl(self.impl) == "xla" else conv_im2col
    kh, kw = self.kernel_size
    kernel = self.param("kernel", nn.initializers.lecun_normal(),
                        (kh, kw, x.shape[-1], self.features))
    bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
    if self.dtype is not None:
      x, kernel, bias = promote_dtype(x, kernel, bias, dtype=self.dtype)
    batch = x.shape[:-3]
    y = conv(x.reshape(-1, *x.shape[-3:]), kernel, self.precision) + bias
    return y.reshape(*batch, *y.shape[1:])


def max_pool2(x: jax.Array) -> jax.Array:
  """2x2 max pool with stride 2: [..., H, W, C] -> [..., H/2, W/2, C] (H and W even)."""
  *batch, h, w, c = x.shape
  if h % 2 or w % 2:
    raise ValueError(f"max_pool2 needs even H and W, got H={h}, W={w}")
  return x.reshape(*batch, h // 2, 2, w // 2, 2, c).max(axis=(-4, -2))
