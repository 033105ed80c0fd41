"""The loss of an exported model folder, as anyone would compute it: Hugging Face only.

``python -I export_loss.py MODEL_DIR BATCHES`` loads MODEL_DIR with ``transformers``
(``from_pretrained`` of the class its config names) and the held-out micro-batches from
BATCHES (safetensors: ``<index>.<input>`` keys), and prints one JSON line: each micro-batch's
loss, in fp32, in the mode the trainer computed its loss in (training mode where the config has
dropout). Run isolated (``-I``), it imports nothing of jobgen's or the payload's, and says so:
the line lists any such module it finds loaded, which the caller refuses.
"""
from __future__ import annotations

import json
import sys
from typing import Any

OURS = ("jobgen", "common", "smoke", "habana_deepspeed", "export_hf", "export_check",
        "smp_fsdp", "train_fsdp", "fsdp_model", "export_smp")


def micro_batches(path: str) -> list[dict[str, Any]]:
    from safetensors.torch import load_file

    flat = load_file(path)
    batches: dict[int, dict[str, Any]] = {}
    for key, tensor in flat.items():
        index, name = key.split(".", 1)
        batches.setdefault(int(index), {})[name] = tensor
    return [batches[index] for index in sorted(batches)]


def main(argv: list[str]) -> int:
    import torch
    import transformers

    model_dir, batches_path = argv[1], argv[2]
    config = transformers.AutoConfig.from_pretrained(model_dir)
    model_class = getattr(transformers, (config.architectures or [""])[0])
    model = model_class.from_pretrained(model_dir, dtype=torch.float32)
    dropout = any(float(getattr(config, name, 0) or 0) > 0 for name in (
        "hidden_dropout_prob", "attention_probs_dropout_prob", "hidden_dropout",
        "attention_dropout"))
    model.train(dropout)
    torch.manual_seed(0)
    losses = []
    with torch.no_grad():
        for batch in micro_batches(batches_path):
            losses.append(float(model(**batch).loss))
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in OURS)
    print(json.dumps({"losses": losses, "class": model_class.__name__, "dropout": dropout,
                      "ours_loaded": loaded}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
