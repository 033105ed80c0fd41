"""One node's checks of the health gate (health.py runs them and judges the reports): devices,
EFA interfaces, storage, the clock, and a CPU rehearsal's faked bad node. Each failure is one
line naming the node, its host, the check, what was seen and what was needed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

GIB = 1 << 30
SMOKE_ENV = "JOBGEN_SMOKE_UNHEALTHY_NODE"


def say(text: str) -> None:
    who = os.environ.get("FLOW_WHO", "jobgen")
    print(f"{who}: {text}", file=sys.stderr, flush=True)


def host() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def sysroot(path: str) -> str:
    root = os.environ.get("JOBGEN_HEALTH_SYSROOT", "")
    return root.rstrip("/") + path if root else path


def run(argv: List[str], timeout: float) -> tuple:
    """(exit status or None when missing/timed out, output, why)."""
    if shutil.which(argv[0]) is None:
        return None, "", f"{argv[0]} not found"
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, "", f"`{' '.join(argv)}` took longer than {timeout:g} s"
    except OSError as exc:
        return None, "", f"`{' '.join(argv)}` could not start ({exc.strerror})"
    return done.returncode, done.stdout.decode(errors="replace"), ""


class Report:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.host = host()
        self.failures: List[Dict[str, str]] = []
        self.passed: List[str] = []
        self.notes: List[str] = []

    def fail(self, check: str, seen: str, needs: str) -> None:
        self.failures.append({"check": check, "seen": seen, "needs": needs})
        say(f"health: node {self.rank} ({self.host}) failed {check}: {seen}; needs {needs}")


def check_devices(spec: Dict[str, Any], report: Report, timeout: float) -> None:
    count = int(spec["count"])
    if spec.get("files"):
        found = sorted(glob.glob(sysroot(spec["files"])))
        if len(found) != count:
            report.fail("devices", f"{len(found)} device files {spec['files']}",
                        f"{count}")
            return
    argv = spec.get("command")
    if argv:
        status, out, why = run(list(argv), timeout)
        if status is None and why.endswith("not found"):
            report.notes.append(f"devices: {why}; counted the device files only")
        elif status is None:
            report.fail("devices", why, f"`{argv[0]}` to answer")
            return
        elif status != 0:
            last = (out.strip().splitlines() or ["no output"])[-1][:160]
            report.fail("devices", f"`{' '.join(argv)}` exited {status} ({last})",
                        "exit status 0")
            return
        elif spec.get("count_pattern"):
            pattern = re.compile(spec["count_pattern"])
            listed = sum(1 for line in out.splitlines() if pattern.search(line))
            if listed != count:
                report.fail("devices", f"`{argv[0]}` lists {listed}", f"{count}")
                return
    report.passed.append("devices")


def check_efa(count: int, report: Report) -> None:
    root = Path(sysroot("/sys/class/infiniband"))
    up: List[str] = []
    down: List[str] = []
    for dev in sorted(root.glob("*")) if root.is_dir() else []:
        states = [p.read_text(errors="replace").strip()
                  for p in sorted(dev.glob("ports/*/state")) if p.is_file()]
        (up if any("ACTIVE" in s for s in states) else down).append(dev.name)
    if len(up) < count:
        seen = f"{len(up)} EFA interfaces up" + (f" ({', '.join(down)} down)" if down else "")
        report.fail("efa", seen, f"{count} up")
    else:
        report.passed.append("efa")


def check_storage(name: str, folder: str, free_gib: float, report: Report) -> None:
    # A folder the job has not made yet is probed where it will be made (the gate creates
    # nothing: the node-local cache copy, for one, refuses a folder it did not make).
    path = Path(folder)
    while not path.exists() and path != path.parent:
        path = path.parent
    probe = path / f".jobgen-health-{report.host}-{os.getpid()}"
    started = time.monotonic()
    try:
        if not path.is_dir():
            raise OSError(0, f"{path} is not a folder")
        with open(probe, "wb") as out:
            out.write(os.urandom(1 << 20))
            out.flush()
            os.fsync(out.fileno())
        if probe.stat().st_size != 1 << 20:
            raise OSError(0, "the file read back short")
    except OSError as exc:
        report.fail(name, f"{folder} is not writable ({exc.strerror or exc})", "a writable folder")
        return
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    stat = os.statvfs(path)
    free = stat.f_bavail * stat.f_frsize / GIB
    if free < free_gib:
        report.fail(name, f"{free:.1f} GiB free at {folder}", f"{free_gib:g} GiB")
        return
    report.passed.append(f"{name} ({free:.0f} GiB free, 1 MiB written in "
                         f"{time.monotonic() - started:.2f} s)")


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    # struct timex of Linux (x86_64 and aarch64), as glibc's adjtimex(2) takes it.
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long),
                ("status", ctypes.c_int), ("constant", ctypes.c_long),
                ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time", _Timeval), ("tick", ctypes.c_long), ("ppsfreq", ctypes.c_long),
                ("jitter", ctypes.c_long), ("shift", ctypes.c_int), ("stabil", ctypes.c_long),
                ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long), ("errcnt", ctypes.c_long),
                ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int), ("pad", ctypes.c_int * 11)]


def kernel_clock() -> Optional[tuple]:
    """(synchronised, estimated error in ms) from adjtimex(2), or None where it cannot be asked."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        timex = _Timex()
        state = libc.adjtimex(ctypes.byref(timex))
    except (OSError, AttributeError):
        return None
    unsync = bool(timex.status & 0x40)          # STA_UNSYNC
    return state != 5 and not unsync, timex.esterror / 1000.0   # 5: TIME_ERROR


def check_clock(max_ms: float, report: Report, timeout: float) -> None:
    status, out, _ = run(["chronyc", "-n", "tracking"], timeout)
    if status == 0:
        leap = re.search(r"^Leap status\s*:\s*(.+)$", out, re.M)
        offset = re.search(r"^System time\s*:\s*([0-9.]+) seconds (fast|slow)", out, re.M)
        if leap and "Not synchronised" in leap.group(1):
            report.fail("clock", "chrony: not synchronised", f"an error under {max_ms:g} ms")
        elif offset and float(offset.group(1)) * 1000 > max_ms:
            report.fail("clock", f"{float(offset.group(1)) * 1000:.0f} ms {offset.group(2)} "
                        "(chrony)", f"at most {max_ms:g} ms")
        else:
            report.passed.append("clock (chrony)")
        return
    kernel = kernel_clock()
    if kernel is None:
        report.notes.append("clock: neither chronyc nor adjtimex answered; not checked")
        return
    synced, error_ms = kernel
    if not synced:
        report.fail("clock", "the kernel says it is not synchronised (no chrony or ntpd)",
                    f"a synchronised clock, error under {max_ms:g} ms")
    elif error_ms > max_ms:
        report.fail("clock", f"estimated error {error_ms:.0f} ms (kernel)",
                    f"at most {max_ms:g} ms")
    else:
        report.passed.append("clock (kernel)")


def job_folder(log_dir: Path) -> Path:
    """The job's folder over its allocations (Slurm logs each one under restart-N)."""
    return log_dir.parent if log_dir.name.startswith("restart-") else log_dir


def smoke_fault(report: Report, log_dir: Path, count: int) -> None:
    """JOBGEN_SMOKE_UNHEALTHY_NODE: the node at that index fails, and in the job's later
    allocations whichever node has that host (a broken machine stays broken)."""
    wanted = os.environ.get(SMOKE_ENV, "").strip()
    if not wanted:
        return
    if not wanted.isdigit():
        raise SystemExit(f"health: {SMOKE_ENV}={wanted!r} is not a node index")
    marks = job_folder(log_dir) / "smoke-unhealthy-host"
    try:
        first_seen, bad_host = marks.read_text().split()
    except (OSError, ValueError):
        first_seen, bad_host = "", ""
    if not bad_host and report.rank == int(wanted):
        marks.parent.mkdir(parents=True, exist_ok=True)
        marks.write_text(f"{log_dir.name} {report.host}\n")
        first_seen, bad_host = log_dir.name, report.host
    # In the allocation that first saw it, only that node (emulated nodes can share a host).
    broken = report.rank == int(wanted) if first_seen == log_dir.name else report.host == bad_host
    if broken:
        report.fail("devices", f"{count - 1} of {count} present (faked: {SMOKE_ENV}={wanted})",
                    f"{count}")
