"""Which block's CLS token serves dinov2-imgfocus best, frozen: NCM and LDA (gdacil's defaults)
on the CLS token of blocks 4 to 12, each under a LayerNorm without affine parameters.

    GDACIL_DATA=... python scripts/imgfocus_blocks.py cifar10 60 112 [OUT.json]

takes up to 60 images of each class (all splits pooled, gdacil.bench.featuresets' seeded pool),
2/3 of each class to fit and 1/3 to test (seed 0), at 112 px, on one thread, and adds the row to
OUT.json (default benchmarks/imgfocus_blocks.json). docs/backbones.md quotes the result.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from gdacil import ClassGaussians
from gdacil.backbones import build_backbone
from gdacil.bench.featuresets import _pool, split
from gdacil.data import build_dataset
from gdacil.heads import LDA, NCM

BLOCKS = range(4, 13)


def main(name: str, per_class: int, size: int, out: Path) -> None:
    torch.set_num_threads(1)
    ds = build_dataset(name)
    ids, labels = _pool(ds, per_class)
    bb = build_backbone("dinov2-imgfocus", block=12, final_norm="pretrained", size=size)
    feats: dict[int, list[torch.Tensor]] = {b: [] for b in BLOCKS}
    start = time.perf_counter()
    with torch.no_grad():
        for s in range(0, len(ids), 32):
            x = bb.transform(ds.load(ids[s:s + 32]))
            hidden = bb.model(pixel_values=x, output_hidden_states=True).hidden_states
            for b in BLOCKS:
                feats[b].append(torch.nn.functional.layer_norm(hidden[b][:, 0], (384,), eps=1e-6))
    seconds = time.perf_counter() - start
    train, test = split(labels, 1 / 3, 0)
    row = {"dataset": name, "per_class": per_class, "size": size, "images": len(ids),
           "img_per_s": len(ids) / seconds, "blocks": {}}
    for b, parts in feats.items():
        X = torch.cat(parts).double()
        stats = ClassGaussians(dim=384)
        stats.update(X[train], torch.as_tensor(labels[train]))
        row["blocks"][str(b)] = {
            head: float((cls().fit(stats).predict(X[test]).numpy() == labels[test]).mean())
            for head, cls in (("ncm", NCM), ("lda", LDA))}
        print(name, size, b, row["blocks"][str(b)], flush=True)
    rows = json.loads(out.read_text())["runs"] if out.exists() else []
    rows = [r for r in rows if (r["dataset"], r["size"]) != (name, size)] + [row]
    out.write_text(json.dumps({"machine": "2-core AMD EPYC (AVX512-BF16), torch 2.13.0+cpu, "
                               "one thread", "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    target = Path(sys.argv[4]) if len(sys.argv) > 4 else Path("benchmarks/imgfocus_blocks.json")
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), target)
