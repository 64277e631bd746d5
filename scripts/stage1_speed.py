"""Milliseconds per Stage-1 SeqFT step on images, by backbone, resolution and precision.

    python scripts/stage1_speed.py [OUT.json]

SeqFT (the paper's preset, the default augmentation) on 32 openclipart images of 2 classes,
batch 16, one torch thread: 3 warm-up steps, then the median of 3 timed runs of 5 steps each,
for dinov2-imgfocus (block 10) and EfficientNet-Lite0 at 112, 168 and 224 px, in fp32 and bf16
(autocast; native on a CPU with AVX512-BF16 or AMX). Writes OUT.json (default
benchmarks/stage1_speed.json); README.md and docs/backbones.md quote it.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

from gdacil._hardware import native_bfloat16
from gdacil.adapt import build_strategy
from gdacil.backbones import build_backbone
from gdacil.bench.common import machine_info

ROOT = Path("/usr/share/openclipart/png")


def images() -> tuple[list, list[int]]:
    from PIL import Image

    raws, labels = [], []
    for label, folder in enumerate(("animals", "food")):
        for path in sorted((ROOT / folder).rglob("*.png"))[:16]:
            with Image.open(path) as im:
                im.thumbnail((512, 512))
                raws.append(im.convert("RGB"))
            labels.append(label)
    return raws, labels


def ms_per_step(name: str, size: int, precision: str, raws: list, labels: list[int]) -> float:
    bb = build_backbone(name, size=size).set_precision(precision)
    times = []
    for steps in (3, 5, 5, 5):
        s = build_strategy("seqft", train={"steps": steps, "batch_size": 16, "augment": "auto"})
        log = s.adapt_task(bb, 0, raws, labels, generator=0)
        times.append(1000 * log["seconds"] / steps)
    return statistics.median(times[1:])


def main(out: Path) -> None:
    torch.set_num_threads(1)
    raws, labels = images()
    rows = []
    for name in ("dinov2-imgfocus", "efficientnet-lite0"):
        for size in (112, 168, 224):
            for precision in ("fp32", "bf16"):
                ms = ms_per_step(name, size, precision, raws, labels)
                rows.append({"backbone": name, "size": size, "precision": precision,
                             "ms_per_step": ms})
                print(name, size, precision, f"{ms:.0f} ms/step", flush=True)
    out.write_text(json.dumps({"machine": machine_info(), "native_bf16": native_bfloat16("cpu"),
                               "threads": 1, "batch_size": 16, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("benchmarks/stage1_speed.json"))
