"""The checkpoint a NeMo training pass resumes from, chosen once by the launcher (launch.sh).

usage: resume.py CHECKPOINTS_DIR HYDRA_OVERRIDE...   (prints the path, or nothing)

NeMo's exp_manager picks the newest ``*.ckpt`` by modification time, on each node. After a restore
from S3 (SageMaker restores the whole checkpoint prefix on every instance of a retry) that time is
when the file was downloaded, so nodes could resume from different steps, or from a step whose
other shards never arrived. Here the choice is by the step number in NeMo's file name
(``...--step=400-consumed_samples=...ckpt``) and a step counts only when every tensor/pipeline
rank folder (``tp_rank_TT_pp_rank_PPP``, one per model-parallel rank, as the overrides size them)
holds it; every node reads the same restored files, so every node makes the same choice. The path
printed is the one ``model.resume_from_checkpoint`` takes: the rank folder taken off, as NeMo
adds it back per rank. Whether NeMo's own save left each rank's file whole is NeMo's to ensure
(it writes each file in full before the next save starts); only the real trainer can show it.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

STEP = re.compile(r"(?:^|-)step=(\d+)")
RANK = re.compile(r"^(?:tp_rank_\d+_pp_rank_\d+|mp_rank_\d+)$")


def _size(overrides: list[str], key: str) -> int:
    for item in overrides:
        name, _, value = item.partition("=")
        if name.lstrip("+") == key and value.strip().isdigit():
            return max(1, int(value))
    return 1


def rank_folders(tp: int, pp: int) -> list[str]:
    """The folders NeMo saves model-parallel ranks into (none for a single rank)."""
    if tp * pp == 1:
        return []
    return [f"tp_rank_{t:02d}_pp_rank_{p:03d}" for t in range(tp) for p in range(pp)]


def _steps(folder: Path) -> dict[int, list[str]]:
    """Step -> the checkpoint file names in ``folder`` (newest file name last)."""
    found: dict[int, list[str]] = {}
    if folder.is_dir():
        for path in sorted(folder.glob("*.ckpt")):
            match = STEP.search(path.name)
            if match:
                found.setdefault(int(match.group(1)), []).append(path.name)
    return found


def choose(root: Path, tp: int, pp: int) -> Path | None:
    """The newest step complete in every rank folder; its file, without the rank folder."""
    folders = rank_folders(tp, pp)
    if not folders:
        # One rank: NeMo saves beside the rank folders' place; a single-rank folder is read too.
        singles = [root] + [p for p in sorted(root.glob("*")) if RANK.match(p.name)]
        steps: dict[int, list[str]] = {}
        for folder in singles:
            for step, names in _steps(folder).items():
                steps.setdefault(step, []).extend(names)
        if not steps:
            return None
        return root / sorted(steps[max(steps)])[-1]
    per_folder = [_steps(root / name) for name in folders]
    common = set(per_folder[0]).intersection(*per_folder[1:])
    for step in sorted(common, reverse=True):
        names = set(per_folder[0][step]).intersection(*(f[step] for f in per_folder[1:]))
        if names:
            return root / sorted(names)[-1]
    return None


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: resume.py CHECKPOINTS_DIR HYDRA_OVERRIDE...", file=sys.stderr)
        return 2
    overrides = argv[1:]
    chosen = choose(Path(argv[0]), _size(overrides, "model.tensor_model_parallel_size"),
                    _size(overrides, "model.pipeline_model_parallel_size"))
    if chosen is not None:
        print(chosen)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
