"""`fedjax-rep` in a job of several processes: each process runs the command in a child and
turns the runtime's report of a lost process into one line.

When a process of a job dies, JAX's coordination service ends the others by aborting them
from C++, with a multi-line log and a stack trace on stderr that Python cannot catch. The
supervisor (the process the user started) runs the command in a child process, passes its
output through, and keeps back the runtime's own report (from absl's E and F lines, a
Python error log line or a traceback on, all that follows); if the child then fails, it
writes them to a file (in the run's directory) and prints one line that says what happened
and how to resume. Lines of the command's own (`fedjax-rep: ...`) always pass.
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

CHILD = "FEDJAX_REP_JOB_CHILD"  # set in the child: it runs the command itself
# The start of a report: absl's E and F lines (C++), Python's ERROR and CRITICAL log
# lines (e.g. orbax's threads) and tracebacks.
RUNTIME_LOG = re.compile(rb"^([EF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] |(ERROR|CRITICAL):"
                         rb"\w+:|Traceback \(most recent call last\):|Exception in thread )")
OWN = b"fedjax-rep: "


def supervised() -> bool:
  """Whether this process is the child of a supervisor."""
  return os.environ.get(CHILD) == "1"


def follow_supervisor() -> None:
  """In the child: ends this process within a second of its supervisor's death (e.g. a
  SIGKILL, which it cannot pass on), as the job's process it stands for has died."""
  supervisor = os.getppid()

  def watch():
    while os.getppid() == supervisor:
      time.sleep(1.0)
    os._exit(128 + signal.SIGKILL)

  threading.Thread(target=watch, daemon=True).start()


def run(argv: list[str]) -> int:
  """Runs `python -m fedjax_rep ARGV` in a child and returns its exit code (128 + the
  signal that ended it); 1, after one line on stderr, where the runtime ended it."""
  index = next((os.environ[name] for name in ("PROCESS_ID", "SLURM_PROCID",
                                               "OMPI_COMM_WORLD_RANK") if name in os.environ),
               "?")
  child = subprocess.Popen([sys.executable, "-m", "fedjax_rep", *argv],
                           env={**os.environ, CHILD: "1"}, stderr=subprocess.PIPE)
  # Ctrl-C reaches the child from the terminal; a SIGTERM to this process is passed on.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
  held, own_error, pending = [], False, b""
  while chunk := os.read(child.stderr.fileno(), 1 << 16):
    *lines, pending = (pending + chunk).split(b"\n")
    for line in lines:
      line += b"\n"
      if line.startswith(OWN):
        own_error = True
        sys.stderr.buffer.write(line)
      elif held or RUNTIME_LOG.match(line):
        held.append(line)
      else:
        sys.stderr.buffer.write(line)
    if not held and b"\r" in pending:  # progress bars: what is drawn so far
      shown, _, pending = pending.rpartition(b"\r")
      sys.stderr.buffer.write(shown + b"\r")
    sys.stderr.flush()
  held.append(pending)
  code = child.wait()
  code = 128 - code if code < 0 else code
  if code == 0 or not any(held):
    sys.stderr.buffer.write(b"".join(held))
    return code
  out = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--out", "--resume")),
             "the --out directory")
  folder = out if os.path.isdir(out) else None  # beside the run, else a temporary file
  with tempfile.NamedTemporaryFile("wb", dir=folder, prefix=f"job-error-process-{index}-",
                                   suffix=".log", delete=False) as report:
    report.write(b"".join(held))
  if not own_error:
    first = next(line for line in held if line.strip()).decode(errors="replace").strip()
    print(f"fedjax-rep: error: process {index} of the job stopped (exit {code}: "
          f"{first[:160]}...; the whole report: {report.name}); if another process died, "
          f"what ran is saved in {out}: resume the job with `fedjax-rep run --resume {out}` "
          f"on every process", file=sys.stderr)
  return 1
