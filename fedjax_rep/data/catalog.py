"""Every dataset the recipes can use: whether it is on disk, where, and how to get it.

File system checks only, no dataset library imported, so `fedjax-rep data` runs offline and
fast. Loaders raise `missing.DataMissing` with the same how-to when a dataset is absent.
"""

from fedjax_rep.data import leaf, tfds_data


def rows() -> list[tuple[str, bool, str, str]]:
  """(name, present, location, how to get it ('' when present)) of every dataset."""
  table = [("digits", True, "bundled with scikit-learn (data/digits.py)", "")]
  for name in tfds_data.DATASETS:
    present, location = tfds_data.status(name)
    table.append((name, present, location, "" if present else tfds_data.how_to(name)))
  for name in leaf.DATASETS:
    present, location = leaf.status(name)
    table.append((name, present, location, "" if present else leaf.how_to(name)))
  table.append(("synthetic", True, "generated from the seed (data/synthetic.py)", ""))
  present, location = leaf.glove_status()
  table.append(("glove", present, f"{location} (optional, for sent140)",
                "" if present else leaf.glove_how_to()))
  return table
