"""Every dataset the recipes can use: whether it is on disk, where, and how to get it.

File system checks only, no dataset library imported, so `fedjax-rep data` runs offline and
fast: the registered datasets (`datasets`: their `status`), then the data of the recipes
that read their own (Sent140, Synthetic, GloVe). Loaders raise `missing.DataMissing` with
the same how-to when a dataset is absent.
"""

from fedjax_rep.data import datasets, leaf


def rows() -> list[tuple[str, bool, str, str]]:
  """(name, present, location, how to get it ('' when present)) of every dataset."""
  table = [(entry.name, *(entry.status() if entry.status else
                          (True, f"registered by {entry.load.__module__}", "")))
           for entry in datasets.DATASETS.values()]
  present, location = leaf.status("sent140")
  table.append(("sent140", present, location, "" if present else leaf.how_to("sent140")))
  table.append(("synthetic", True, "generated from the seed (data/synthetic.py)", ""))
  present, location = leaf.glove_status()
  table.append(("glove", present, f"{location} (optional, for sent140)",
                "" if present else leaf.glove_how_to()))
  return table
