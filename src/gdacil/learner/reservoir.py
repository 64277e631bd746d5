"""A bounded, seeded reservoir of raw anchor samples, for drift compensation between learns.

A compensator is fitted on the features that the backbone gives for the same unlabelled anchors
before and after a Stage-1 strategy trains it. A deployed learner has no dataset to draw anchors
from, so it keeps some of the raw samples it has learned from: a uniform sample (reservoir
sampling, Vitter's algorithm R) of at most ``size`` of all the samples seen, drawn with a seeded
generator, so the same learns give the same anchors. Texts are kept as they are; images are
stored as PNG files shrunk to the backbone's input resolution (their shorter side to the
preprocessing's resize side), which is all the backbone would see of them.

Anchors remember the class they came from, so forgetting a class also deletes its anchors.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

import numpy as np

from .data import Samples

__all__ = ["Anchor", "AnchorReservoir", "decode_image", "encode_image"]


@dataclass(frozen=True)
class Anchor:
    """One kept sample: its class name and its text, or its image as PNG bytes."""

    label: str
    text: str | None = None
    png: bytes | None = None

    @property
    def file(self) -> str | None:
        """Where a saved model stores the image: ``anchors/<sha256 of the PNG>.png``."""
        return None if self.png is None else f"anchors/{hashlib.sha256(self.png).hexdigest()}.png"

    def raw(self):
        return self.text if self.png is None else decode_image(self.png)


def encode_image(raw, side: int | None) -> bytes:
    """``raw`` (a path, PIL image or array) as RGB PNG bytes, its shorter side shrunk to
    ``side`` (never enlarged)."""
    from PIL import Image

    from ..backbones import to_rgb

    image = to_rgb(raw)
    if side and min(image.size) > side:
        scale = side / min(image.size)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, resample=Image.Resampling.BICUBIC)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def decode_image(png: bytes):
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        return image.convert("RGB")


class AnchorReservoir:
    """At most ``size`` anchors drawn uniformly from the ``seen`` samples offered so far."""

    def __init__(self, size: int, seen: int = 0, anchors: Iterable[Anchor] = ()):
        self.size, self.seen, self.anchors = int(size), int(seen), list(anchors)

    def __len__(self) -> int:
        return len(self.anchors)

    def labels(self) -> list[str]:
        return [a.label for a in self.anchors]

    def raws(self) -> list:
        """The anchors as raw samples (texts, or decoded RGB images)."""
        return [a.raw() for a in self.anchors]

    def plan(self, n_new: int, rng: np.random.Generator) -> list[tuple[str, int]]:
        """The entries after offering ``n_new`` samples: ``("old", i)`` keeps anchor ``i``,
        ``("new", j)`` takes offered sample ``j`` (algorithm R, continuing the count)."""
        entries = [("old", i) for i in range(len(self.anchors))][: self.size]
        first = min(max(self.size - len(entries), 0), n_new)
        entries += [("new", j) for j in range(first)]
        if first < n_new and self.size:
            # sample j replaces slot r, drawn uniformly from the seen + j + 1 samples so far
            r = rng.integers(0, self.seen + np.arange(first, n_new) + 1)
            for j, slot in zip(range(first, n_new), r.tolist()):
                if slot < self.size:
                    entries[slot] = ("new", j)
        return entries

    def offered(self, samples: Samples, load: Callable, rng: np.random.Generator,
                side: int | None, modality: str) -> AnchorReservoir:
        """A new reservoir after offering ``samples`` (``load(keys)`` gives their raw samples;
        only those kept are loaded)."""
        entries = self.plan(len(samples), rng)
        new = sorted({j for kind, j in entries if kind == "new"})
        raws = dict(zip(new, load([samples.keys[j] for j in new]))) if new else {}
        fresh = {j: (Anchor(samples.labels[j], text=raws[j]) if modality == "text"
                     else Anchor(samples.labels[j], png=encode_image(raws[j], side)))
                 for j in new}
        anchors = [self.anchors[i] if kind == "old" else fresh[i] for kind, i in entries]
        return AnchorReservoir(self.size, self.seen + len(samples), anchors)

    def without(self, labels: Iterable[str]) -> AnchorReservoir:
        """A new reservoir without the anchors of classes ``labels``."""
        drop = set(labels)
        return AnchorReservoir(self.size, self.seen, [a for a in self.anchors
                                                      if a.label not in drop])

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> dict:
        return {"size": self.size, "seen": self.seen,
                "anchors": [{"label": a.label, "text": a.text} if a.png is None
                            else {"label": a.label, "file": a.file} for a in self.anchors]}

    def files(self) -> dict[str, bytes]:
        """The image files of the anchors: relative path -> PNG bytes."""
        return {cast(str, a.file): a.png for a in self.anchors if a.png is not None}  # set with png

    @classmethod
    def from_json(cls, data: dict, read: Callable[[str], bytes]) -> AnchorReservoir:
        """The reservoir of :meth:`to_json`; ``read(relative path)`` gives an image file's
        bytes (verified by the caller)."""
        anchors = []
        for entry in data["anchors"]:
            if "file" in entry:
                anchors.append(Anchor(str(entry["label"]), png=read(entry["file"])))
            else:
                anchors.append(Anchor(str(entry["label"]), text=str(entry["text"])))
        return cls(int(data["size"]), int(data["seen"]), anchors)
