"""CSV tables without jax: the text of rows as the run directories' CSV files hold them
(`csv_text`), and a table as aligned columns for the terminal (`aligned`)."""

import csv
import io


def csv_text(rows: list[dict], first=("algorithm", "seed", "round")) -> str:
  """CSV of `rows` (dicts); columns are `first`, then the rest in first-seen order."""
  columns = list(first)
  for row in rows:
    columns += [c for c in row if c not in columns]
  buffer = io.StringIO()
  writer = csv.DictWriter(buffer, fieldnames=columns, restval="", lineterminator="\n")
  writer.writeheader()
  for row in rows:
    writer.writerow({k: (f"{v:.8g}" if isinstance(v, float) else v) for k, v in row.items()})
  return buffer.getvalue()


def aligned(table: list[list[str]]) -> str:
  """A table as aligned columns.

  Args:
    table: its rows (the header first), lists of cells of equal length.

  Returns:
    One line per row, each cell left-aligned and padded to its column's widest cell, the
    columns two spaces apart (no final newline; empty for an empty table).
  """
  if not table:
    return ""
  widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
  return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths))
                   for row in table)
