"""Plugins: a user's Python file, imported before a recipe's configuration is read, that
registers its algorithms with `fr.register_algorithm` and its datasets with
`fr.register_dataset` (`fedjax-rep run --plugin FILE`).
config.json records each plugin's absolute path and the sha256 of its content; a replay
or --resume loads the same files and refuses one that is missing or changed."""

import hashlib
import os
import re
import runpy
import traceback

from fedjax_rep.experiments.config import ConfigError

LOADED: dict[str, str] = {}  # absolute path -> sha256 of each plugin imported so far


class PluginError(ConfigError):
  """A plugin that cannot be loaded: one line saying why and what to do (the CLI exits 2)."""


def sha256(path: str) -> str:
  """The sha256 (hex) of the content of the file `path`."""
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def module_name(path: str) -> str:
  """The module name a plugin is imported under: fedjax_rep_plugin_<stem>_<hash of its
  absolute path> (the same file, the same module; two files of one name, two modules)."""
  stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
  return f"fedjax_rep_plugin_{stem}_{hashlib.sha256(path.encode()).hexdigest()[:8]}"


def _checked_path(path: str) -> str:
  """The absolute path of plugin `path`; PluginError where it is no .py file."""
  absolute = os.path.abspath(path)
  if not os.path.isfile(absolute):
    raise PluginError(f"--plugin {path}: no such file; give the path of a Python file that "
                      f"registers algorithms or datasets (fr.register_algorithm, "
                      f"fr.register_dataset)")
  if not absolute.endswith(".py"):
    raise PluginError(f"--plugin {path} is not a .py file; give a Python source file that "
                      f"registers algorithms or datasets (fr.register_algorithm, "
                      f"fr.register_dataset)")
  return absolute


def _failure(path: str, error: BaseException) -> str:
  """One line on why importing plugin `path` raised `error`: a syntax error with its
  file:line, else the exception's type and message and the plugin's line that raised it."""
  if isinstance(error, SyntaxError):
    return (f"--plugin {path}: syntax error at {error.filename}:{error.lineno}: {error.msg}; "
            f"fix the file")
  frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == path]
  where = f" at {path}:{frames[-1].lineno}" if frames else ""
  message = " ".join(str(error).split())
  return (f"--plugin {path} raised {type(error).__name__}{where} while importing: {message}; "
          f"fix the file")


def load(path: str) -> dict:
  """Imports plugin `path` (once per content: a file imported already and unchanged is
  not imported again) and returns its record {"path": absolute path, "sha256": hex};
  PluginError (one line) when it is missing, not a .py file, or raises while importing."""
  absolute = _checked_path(path)
  digest = sha256(absolute)
  if LOADED.get(absolute) != digest:
    try:  # runpy runs the file as module `module_name` (the module dataclasses look up)
      runpy.run_path(absolute, run_name=module_name(absolute))
    except Exception as error:  # noqa: BLE001  every failure of the user's file is one line
      raise PluginError(_failure(absolute, error)) from None
    LOADED[absolute] = digest
  return {"path": absolute, "sha256": digest}


def load_all(paths) -> list[dict]:
  """`load` of each plugin of `paths`, in order: their records for config.json."""
  return [load(path) for path in paths]


def recorded(records, config_path: str) -> list[str]:
  """The paths of the plugins that config.json `config_path` records (`records`: its
  "plugins" entry), each checked to be there with the recorded sha256; PluginError (one
  line) naming the first missing or changed one."""
  paths = []
  for record in records or ():
    path = record["path"]
    if not os.path.isfile(path):
      raise PluginError(f"{config_path} ran with plugin {path}, which is missing: put it "
                        f"back, or start a new run with --plugin")
    if sha256(path) != record["sha256"]:
      raise PluginError(f"plugin {path} changed since {config_path} was written (sha256 "
                        f"{sha256(path)[:12]}..., recorded {record['sha256'][:12]}...): "
                        f"restore it, or start a new run with --plugin {path} --out NEW")
    paths.append(path)
  return paths
