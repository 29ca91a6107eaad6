"""The error of a dataset that is not on disk."""


class DataMissing(FileNotFoundError):
  """A dataset's files are not where they are looked for; the message is one line naming the
  command that prepares them."""
