"""`jobgen run RECIPE --smoke --every K`: the follower (jobgen/payloads/follow.py) beside the
training processes on this machine, as Slurm runs it beside the training job: it starts first,
exports (and scores) each sealed step that is a multiple of K as training goes, and is told that
training has ended by a file in the job's log folder; then it sweeps once more and the run waits
for it. Its output goes to RUN_DIR/logs/JOB/follow.log and, prefixed, to the terminal."""
from __future__ import annotations

import contextlib
import subprocess
import threading
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from ...job.spec import JobSpec
from ...plumbing.errors import printable
from ...plumbing.render import shell_quote

ENDED = "training-ended"        # RUN_DIR/logs/JOB/training-ended: the follower's last sweep
POLL_S = 1.0


class Follower:
    def __init__(self) -> None:
        self.status: Optional[int] = None
        self.cancelled = False      # set by the body: training was stopped (Ctrl-C)


@contextlib.contextmanager
def beside(spec: JobSpec, job_id: str, names: Sequence[str], every: int,
           emit: Callable[[str], None], say: Callable[[str], None]) -> Iterator[Follower]:
    """Run the follower while the body trains; on leaving, tell it training ended and wait for
    it (a cancelled training, or an error in the body, stops it instead). Its status is set on
    the yielded Follower."""
    from ...payloads import follow
    from ...plumbing import fsio
    from . import needs
    from . import runner as local_runner
    folder = Path(spec.run_dir, "logs", job_id)
    ended = folder / ENDED
    work = follow.work(spec, names, every, ("--until", str(ended), "--poll", str(POLL_S)))
    env = local_runner.node_env({})
    needs.check(spec, env, programs=[work.program])
    local_runner.place_payload(spec)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "follow.log"
    argv = [needs.node_python(env) or "python3",
            str(Path.cwd() / spec.payload_dir / work.program), *work.tasks[0]]
    fsio.append(log, f"+ {shell_quote(argv)}\n")
    say(f"jobgen: the follower exports each sealed step that is a multiple of {every} while "
        f"training goes (its log: {log})")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)

    def relay() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            fsio.append(log, line)
            emit(printable(f"[follow] {line.rstrip()}"))

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    found = Follower()
    try:
        yield found
        if not found.cancelled:
            fsio.write_file(ended, "training ended\n")
            found.status = proc.wait()
    finally:
        if proc.poll() is None:
            from .runner import _stop
            _stop(proc)
        reader.join(timeout=10)
        if found.status is None:
            found.status = proc.returncode
