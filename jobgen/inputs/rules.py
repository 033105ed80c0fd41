"""Recipe values checked against what the trainers accept, before anything is rendered: the
rules a single field's type cannot say (enums of the upstream trainer, signs, cross-field
arithmetic, what a process environment can carry), and the names that reach #SBATCH lines, file
names and the job's environment (check_names). Each refusal is one line naming the file,
the key and the rule. Where an upstream trainer only warns and changes the value (Megatron turns
sequence parallelism off at tensor parallelism 1), jobgen refuses: a silent change is worse."""
from __future__ import annotations

import re
from typing import Any, Optional

from ..plumbing.errors import ConfigError

# neuronx-nemo-megatron at the SDK 2.20 release the payload is pinned to (d22aabf; the same at
# 2.21), nemo/collections/nlp/modules/common/megatron/transformer.py: the block types
# ParallelTransformerLayer_ accepts.
BLOCK_TYPES = ("pre_ln", "post_ln", "normformer", "gpt_j")
# numpy's and torch's seeding both take a 32-bit unsigned seed in the trainers.
SEED_MAX = 2**32 - 1
# Linux refuses one argument or environment string longer than this (MAX_ARG_STRLEN, 32 pages),
# counted with the name, the '=' and the terminating NUL.
ENV_MAX = 131072
SPLIT_NUMBER = r"\s*(?:\d+(?:\.\d*)?|\.\d+)\s*"
# Linux's limits on a path (PATH_MAX, with its terminating NUL) and on each name in it (NAME_MAX,
# the file systems a job's folders are on: ext4, xfs, Lustre), in bytes of its UTF-8 form.
PATH_MAX = 4096
FILE_NAME_MAX = 255


def path_problem(path: str) -> Optional[str]:
    """Why no file system here or on the nodes can hold `path` (a phrase after it), or None: a
    NUL byte, a name longer than FILE_NAME_MAX, or a path of PATH_MAX bytes or more."""
    if "\0" in path:
        return "holds a NUL byte, which no path can"
    size = len(path.encode("utf-8", "surrogateescape"))
    if size >= PATH_MAX:
        return f"is {size} bytes long; a path is at most {PATH_MAX - 1}"
    longest = max((len(p.encode("utf-8", "surrogateescape")) for p in path.split("/")), default=0)
    if longest > FILE_NAME_MAX:
        return f"has a name of {longest} bytes; a file name is at most {FILE_NAME_MAX}"
    return None


def check_site_paths(work_dir: str, compile_cache: str, local_compile_cache: "str | None",
                     shown: str) -> None:
    """Folders a job writes into, or a cache step refreshes, that would harm what is there: the
    root, the home folder, and a cache that is the run folders' own folder or above it."""
    import os
    import posixpath
    home = os.path.expanduser("~").rstrip("/") or "/"

    def norm(path: str) -> str:
        return posixpath.normpath(path) if path else path

    runs = norm(work_dir)
    for key, value in (("paths.work_dir", work_dir), ("paths.compile_cache", compile_cache),
                       ("paths.local_compile_cache", local_compile_cache)):
        if value is None:
            continue
        path = norm(value)
        if path in ("", "/", home, "."):
            raise ConfigError(f"{shown}: {key}: {value!r} is the root, the home folder or the "
                              "submission folder itself: give a folder of its own")
        if key != "paths.work_dir" and (path == runs or runs.startswith(path.rstrip("/") + "/")):
            raise ConfigError(f"{shown}: {key}: {value!r} holds the run folders "
                              f"(paths.work_dir {work_dir!r}): give the cache a folder of its "
                              "own")


def check_limits(data: Any, limits: dict[str, dict[str, Any]], where: str) -> None:
    """The single-value rules of a JSON Schema table (jobgen/inputs/limits.py), applied to the
    loaded record as plain data: the schema and the loader refuse the same values."""
    for key, rule in limits.items():
        value: Any = data
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None or isinstance(value, bool):
            continue
        shown = repr(value) if isinstance(value, str) else value
        if isinstance(value, (int, float)):
            for word, ok, say in (("minimum", lambda v, m: v >= m, "at least"),
                                  ("maximum", lambda v, m: v <= m, "at most"),
                                  ("exclusiveMinimum", lambda v, m: v > m, "more than"),
                                  ("exclusiveMaximum", lambda v, m: v < m, "less than")):
                if word in rule and not ok(value, rule[word]):
                    raise ConfigError(f"{where}: {key}: {shown} must be {say} {rule[word]}")
        if isinstance(value, str):
            if len(value) < rule.get("minLength", 0):
                raise ConfigError(f"{where}: {key}: must not be empty")
            if len(value) > rule.get("maxLength", len(value)):
                raise ConfigError(f"{where}: {key}: {len(value)} characters, more than "
                                  f"{rule['maxLength']}")
            if "enum" in rule and value not in rule["enum"]:
                raise ConfigError(f"{where}: {key}: {shown} is not one of "
                                  f"{', '.join(rule['enum'])}")
            # the whole value (re.search's $ would let a trailing line break through)
            if "pattern" in rule and not re.fullmatch(rule["pattern"], value):
                raise ConfigError(f"{where}: {key}: {shown} does not match {rule['pattern']}")


# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or no limit.
TIME_LIMIT_RE = re.compile(r"\d{1,10}(?::\d{1,10}){0,2}|\d{1,10}-\d{1,10}(?::\d{1,10}){0,2}"
                           r"|UNLIMITED|INFINITE", re.IGNORECASE | re.ASCII)
# Slurm keeps a time limit in minutes in 32 bits; its two highest values mean "infinite" and
# "no value", so the longest limit it takes is 2**32 - 3 minutes.
SLURM_TIME_MAX_S = (2**32 - 3) * 60


def time_limit_seconds(text: str) -> Optional[int]:
    """A time limit in Slurm's formats (valid: TIME_LIMIT_RE) in seconds; None for no limit."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:   # D-H[:M[:S]]
        parts += [0] * (3 - len(parts))
        return max(1, int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2])
    if len(parts) == 1:    # M
        return max(1, parts[0] * 60)
    if len(parts) == 2:    # M:S
        return max(1, parts[0] * 60 + parts[1])
    return max(1, parts[0] * 3600 + parts[1] * 60 + parts[2])   # H:M:S


def time_limit_ok(text: str) -> bool:
    """Whether `text` is a time limit Slurm takes: one of its formats, within its range."""
    if not TIME_LIMIT_RE.fullmatch(text):
        return False
    seconds = time_limit_seconds(text)
    return seconds is None or seconds <= SLURM_TIME_MAX_S


# `env:` names a recipe may not set, in one place. Names jobgen's own scripts own (the sbatch
# template, payload/common/node_launch.sh, env/containers/entrypoint.sh): a recipe value would
# silently replace what the job computed.
JOBGEN_OWNED = frozenset({
    "RUN_DIR", "PAYLOAD_DIR", "LAUNCHER", "ACTIVATE", "MAX_RESTARTS", "COMPILE_MODE",
    "COMPILE_CACHE", "LOCAL_COMPILE_CACHE", "COMPILE_KEY", "COMPILE_ARGS", "TRAIN_ARGS",
    "PREPARE", "MASTER_RESOLVER", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK",
    "LOCAL_RANK", "NEURON_COMPILE_CACHE_URL", "PT_HPU_RECIPE_CACHE_CONFIG",
})
# Names that change how a shell or the dynamic loader behaves: one of these in the job's
# environment can run an arbitrary file (BASH_ENV, ENV, LD_PRELOAD) or change what every later
# line means (IFS, PATH, SHELLOPTS). LD_LIBRARY_PATH stays allowed: Gaudi's EFA setup sets it.
SHELL_AND_LOADER = frozenset({
    "BASH_ENV", "ENV", "IFS", "PATH", "CDPATH", "GLOBIGNORE", "SHELLOPTS", "BASHOPTS", "PS4",
    "PROMPT_COMMAND", "HOME", "SHELL", "LD_PRELOAD", "LD_AUDIT", "PYTHONSTARTUP",
    "PYTHONPATH", "PYTHONHOME", "PYTHONINSPECT",
})
RESERVED_PREFIXES = ("JOBGEN_", "SLURM_", "SBATCH_", "SRUN_", "AWS_BATCH_", "BASH_FUNC_")


def check_env_name(name: str, where: str) -> None:
    if name in JOBGEN_OWNED or name.startswith(RESERVED_PREFIXES):
        raise ConfigError(f"{where}: env.{name}: set by jobgen or the scheduler; a recipe may "
                          "not set it")
    if name in SHELL_AND_LOADER:
        raise ConfigError(f"{where}: env.{name}: changes how the job's shell or loader "
                          "behaves; a recipe may not set it")
