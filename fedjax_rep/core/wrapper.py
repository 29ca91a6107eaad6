"""The base of an algorithm around another (`inner`): the attributes the round loop reads of
it are the inner algorithm's."""


class Wrapper:
  """An algorithm with an `inner` algorithm (a dataclass field of the subclass) whose compile
  options and blow-up metric it keeps."""

  @property
  def quick_compile(self) -> bool:
    """The inner algorithm's (`core.loop.compiler_options`)."""
    return self.inner.quick_compile

  @property
  def tracked_metric(self) -> str | None:
    """The inner algorithm's (the loop's blow-up bound)."""
    return self.inner.tracked_metric
