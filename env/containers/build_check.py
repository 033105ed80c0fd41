"""Checks the Dockerfiles of env/containers run while an image is built, on the base image's
own Python (3.10 or later, standard library only). The values come from the build arguments
that `jobgen image-context` passes from env/containers/images.yaml:

  build_check.py base         the base carries the declared Python (BASE_PYTHON) and torch
                              (BASE_TORCH)
  build_check.py constraints REGEX
                              prints NAME==VERSION for every installed distribution whose name
                              matches REGEX: a pip constraints file that holds the base's own
                              torch and framework packages while the image's PACKAGES install
  build_check.py imports      runs each statement of IMPORTS (a JSON list) with IMPORT_PATH on
                              sys.path, in one namespace, and names the first that fails
  build_check.py start        starts this python3 with the arguments START_CHECK holds (a JSON
                              list: jobgen's wrapper --check and the trainer's program), as a
                              job starts it: this environment and working folder, no path
                              added; nothing to do where the image declares no program

Exit status 1 with one line on stderr when a check fails.
"""
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import traceback


def fail(message):
    sys.stderr.write(f"image check: {message}\n")
    sys.exit(1)


def arg(name):
    value = os.environ.get(name, "")
    if not value:
        fail(f"{name} is not set: build with the arguments `jobgen image-context DIR` prints "
             "(env/containers/images.yaml declares them)")
    return value


def same_release(installed, declared):
    """torch 2.2.2a0+git1234 (Habana's build) and 2.4.1+cu121 are releases 2.2.2 and 2.4.1."""
    return re.fullmatch(re.escape(declared) + r"([a-z]+[0-9]*)?(\+.*)?", installed) is not None


def base():
    want_python, want_torch = arg("BASE_PYTHON"), arg("BASE_TORCH")
    python = "%d.%d" % sys.version_info[:2]
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = "none"
    if python != want_python or not same_release(torch, want_torch):
        fail(f"the base image has Python {python} and torch {torch}; env/containers/images.yaml "
             f"declares Python {want_python} and torch {want_torch} for it")
    print(f"image check: base has Python {python} and torch {torch}, as declared")


def constraints(pattern):
    names = re.compile(pattern, re.IGNORECASE)
    seen = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if names.fullmatch(name):
            seen[name.lower()] = f"{name}=={dist.version}"
    print("\n".join(seen[k] for k in sorted(seen)))


def imports():
    statements = json.loads(arg("IMPORTS"))
    sys.path[:0] = [p for p in os.environ.get("IMPORT_PATH", "").split(":") if p]
    namespace = {"__name__": "image_check"}
    for statement in statements:
        try:
            exec(compile(statement, "<images.yaml imports>", "exec"), namespace)
        except BaseException as exc:  # noqa: BLE001  (SystemExit too: nothing may end it)
            traceback.print_exc()
            fail(f"{statement!r} failed: {type(exc).__name__}: {exc}")
        print(f"image check: ok: {statement}")


def start():
    argv = json.loads(os.environ.get("START_CHECK") or "[]")
    if not argv:
        print("image check: no trainer program to start (images.yaml declares no `starts`)")
        return
    status = subprocess.run([sys.executable, *argv], check=False).returncode
    if status != 0:
        fail(f"{argv[-1]} does not start as a job starts it (python3 {' '.join(argv)}: "
             f"status {status})")
    print(f"image check: ok: {argv[-1]} starts as a job starts it")


def main(argv):
    if argv[:1] == ["base"] and len(argv) == 1:
        base()
    elif argv[:1] == ["constraints"] and len(argv) == 2:
        constraints(argv[1])
    elif argv[:1] == ["imports"] and len(argv) == 1:
        imports()
    elif argv[:1] == ["start"] and len(argv) == 1:
        start()
    else:
        fail("usage: build_check.py base | constraints REGEX | imports | start")


if __name__ == "__main__":
    main(sys.argv[1:])
