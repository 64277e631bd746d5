"""The Stage-1 strategy: adapts a backbone task by task, keeping what later tasks need.

One task is::

    strategy.begin_task(backbone, t, generator=g)   # LoRA adapters, teacher copy, NSP projectors
    log = strategy.train_task(backbone, raw, labels, generator=g)
    strategy.end_task(backbone, raw)               # merge LoRA, accumulate NSP input moments

(or :meth:`Strategy.adapt_task`, which does the three). Between tasks the backbone's weights
(``backbone.model.state_dict()``) and :meth:`Strategy.state_dict` are all the state there is:
saving both after ``end_task`` and loading them into a fresh backbone and strategy continues
bit-identically. The teacher copy, the projectors and the task head live only inside a task.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import cast

import numpy as np
import torch

from .. import distributed
from .._random import make_generator
from .._validation import as_labels
from ..backbones import Backbone, RandomProjection
from ..backbones.base import ImageBackbone
from ..backbones.blocks import linear_weight
from ..data.cache import prefetched
from .augment import (
    Augmentation,
    AugmentConfig,
    apply_augmentations,
    draw_augmentations,
    image_size,
)
from .config import StrategyConfig
from .distill import Teacher
from .lora import attach_lora, merge_lora
from .loss import LOSSES, feature_distillation
from .nullspace import (
    accumulate_moments,
    input_moment_sums,
    input_second_moments,
    null_space_split,
    soft_projector,
)
from .optim import make_optimization
from .params import block_linears, mlp_weight_names, restore_trainable, set_trainable

__all__ = ["Strategy", "minibatches", "trained_backbone"]

_STATE_FORMAT = 1
_LOSS_KEYS = ("loss", "task_loss", "kd_loss")  # the rows of a step's loss terms


def trained_backbone(backbone: Backbone) -> Backbone:
    """The backbone a strategy trains: the base of a :class:`RandomProjection` (RandProj adapts
    the pretrained features, not the random projection on top), else ``backbone`` itself."""
    return backbone.base if isinstance(backbone, RandomProjection) else backbone


def minibatches(n: int, batch_size: int, steps: int, generator: torch.Generator
                ) -> Iterator[torch.Tensor]:
    """``steps`` index batches cycling over ``range(n)``: each pass is a fresh permutation drawn
    from ``generator``, cut into batches of ``batch_size`` (the last one of a pass may be
    smaller)."""
    perm, pos = torch.empty(0, dtype=torch.long), n
    for _ in range(steps):
        if pos >= n:
            perm, pos = torch.randperm(n, generator=generator), 0
        yield perm[pos : pos + batch_size]
        pos += batch_size


def _draw_seed(generator: torch.Generator) -> int:
    return int(torch.randint(0, 2**62, (), generator=generator))


def _input_moments(bb: Backbone, linears: dict, raws: Sequence, batch_size: int
                   ) -> dict[str, torch.Tensor]:
    """NSP input second moments of ``raws``; under torch.distributed each rank runs its shard
    of ``raws`` and the sums and token counts are summed over the ranks, so every rank gets
    the same moments (those of all of ``raws``, up to round-off)."""
    if distributed.world_size() == 1:
        return input_second_moments(bb, linears, raws, batch_size=batch_size)
    sums, counts = input_moment_sums(bb, linears, distributed.shard(raws), batch_size=batch_size)
    n = torch.tensor([counts[name] for name in linears], dtype=torch.float64, device=bb.device)
    distributed.all_reduce_sum([*sums.values(), n])
    return {name: sums[name] / n[i] for i, name in enumerate(linears)}


def _draws(batch: Iterable, augment: AugmentConfig | None, generator: torch.Generator
           ) -> list[Augmentation] | None:
    """The random part of a training batch's inputs: the augmentations of the samples ``batch``
    (``None`` without augmentation, which reads no sample)."""
    if augment is None:
        return None
    return draw_augmentations([image_size(raw) for raw in batch], augment, generator)


def _resolved_augment(augment: AugmentConfig | str | None, bb: Backbone
                      ) -> AugmentConfig | None:
    """``train.augment`` for backbone ``bb``: ``"auto"`` is the default augmentation for an
    image backbone and none otherwise; an explicit one on a non-image backbone is refused."""
    images = isinstance(bb, ImageBackbone)
    if augment == "auto":
        return AugmentConfig() if images else None
    if augment is not None and not images:
        raise ValueError(f"augment applies to image backbones; {bb.name} takes "
                         f"{bb.modality or 'non-image'} inputs (set train.augment=None)")
    return cast("AugmentConfig | None", augment)


def _build(bb: Backbone, batch: Sequence, draws: list[Augmentation] | None) -> dict:
    """The deterministic part: model inputs (CPU tensors) of ``batch`` under ``draws``."""
    if draws is None:
        return bb.preprocess(batch)
    transform = cast(ImageBackbone, bb).transform  # begin_task refuses augment otherwise
    return {"pixel_values": apply_augmentations(batch, draws, transform)}


def _planned_inputs(bb: Backbone, raws: Sequence, plan: tuple) -> tuple[torch.Tensor, dict]:
    """``(idx, inputs)`` of a batch planned as ``(idx, draws)`` (in a worker process)."""
    idx, draws = plan
    return idx, _build(bb, [raws[i] for i in idx.tolist()], draws)


@dataclass
class _Task:
    """What a strategy holds between ``begin_task`` and ``end_task``."""

    index: int
    active: bool
    trained: list[str] = field(default_factory=list)  # parameter names inside backbone.model
    requires_grad: dict[str, bool] = field(default_factory=dict)  # flags before the task
    teacher: Teacher | None = None
    projectors: dict[str, torch.Tensor] = field(default_factory=dict)  # weight name -> P
    augment: AugmentConfig | None = None  # train.augment resolved for the backbone


class Strategy:
    """A Stage-1 backbone adaptation strategy (see :class:`~gdacil.adapt.StrategyConfig`).

    Build it by name with :func:`gdacil.adapt.build_strategy`.

    Parameters
    ----------
    config : StrategyConfig

    Attributes
    ----------
    moments_ : dict of str to torch.Tensor
        NSP only: accumulated uncentred input second moments (float32, CPU) per trained linear
        (module path inside ``backbone.model``), after the tasks seen so far.
    """

    def __init__(self, config: StrategyConfig):
        self.config = config
        self.moments_: dict[str, torch.Tensor] = {}
        self._task: _Task | None = None

    def __repr__(self) -> str:
        return f"Strategy({self.config.name!r}, params={self.config.params!r})"

    @property
    def name(self) -> str:
        return self.config.name

    def trains_on(self, task: int) -> bool:
        """Whether task ``task`` (0-based) changes the backbone."""
        return self.config.params != "none" and (task == 0 or not self.config.first_task_only)

    # ------------------------------------------------------------------ one task
    def begin_task(self, backbone: Backbone, task: int, *, generator=None) -> None:
        """Prepare task ``task`` (0-based): attach fresh LoRA adapters (their initialisation is
        drawn from ``generator``: an int seed or a ``torch.Generator``; needed by LoRA only),
        select the trained tensors, copy them as the distillation teacher (tasks after the
        first), and build the null-space projectors from the moments of the earlier tasks."""
        if self._task is not None:
            raise RuntimeError(f"task {self._task.index} is still open; call end_task first")
        if isinstance(task, bool) or not isinstance(task, (int, np.integer)) or task < 0:
            raise ValueError(f"task must be an integer >= 0; got {task!r}")
        cfg = self.config
        bb = trained_backbone(backbone)
        state = _Task(int(task), self.trains_on(int(task)))
        if state.active:
            state.augment = _resolved_augment(cfg.train.augment, bb)
            if cfg.params == "lora" and generator is None:
                raise ValueError("LoRA strategies draw the adapters' initialisation: pass "
                                 "begin_task(..., generator=seed or torch.Generator)")
            if cfg.null_space is not None and self.moments_:  # before the model is touched
                state.projectors = self._projectors(bb)
            before = {name: p.requires_grad for name, p in bb.model.named_parameters()}
            if cfg.params == "lora":
                gen = make_generator(generator, name="generator")
                state.trained = attach_lora(bb, cfg.lora, seed=_draw_seed(gen))
            else:
                state.trained = mlp_weight_names(bb)
            set_trainable(bb.model, state.trained)
            state.requires_grad = before
            if cfg.kd_weight > 0 and state.index > 0:
                state.teacher = Teacher.capture(bb.model, state.trained)
        self._task = state

    def _projectors(self, bb: Backbone) -> dict[str, torch.Tensor]:
        ns = self.config.null_space
        assert ns is not None  # begin_task builds projectors only with a null-space config
        linears = block_linears(bb, ("mlp_in", "mlp_out"))
        if set(linears) != set(self.moments_):
            raise ValueError(f"the null-space moments are for linears {sorted(self.moments_)}, "
                             f"not this backbone's {sorted(linears)}")
        out = {}
        for name, module in linears.items():
            weight = cast(torch.Tensor, module.weight)
            moment = self.moments_[name].to(weight.device)
            v_null, _ = null_space_split(moment, ns.eps, jitter=ns.eigen_jitter)
            out[f"{name}.weight"] = soft_projector(v_null, ns.soft).to(weight.dtype)
        return out

    def train_task(self, backbone: Backbone, raws: Sequence, labels, *, generator,
                   on_step: Callable[[int, dict[str, float]], None] | None = None,
                   num_workers: int = 0) -> dict:
        """Train the open task on ``raws`` (raw samples the backbone preprocesses) with
        ``labels`` (global class ids; the temporary head covers their distinct values).

        Every random draw (head initialisation, batch order, augmentation) comes from
        ``generator`` (an int seed or a ``torch.Generator``).

        With ``num_workers > 0``, that many forked worker processes build the next batches'
        inputs (preprocessing, tokenisation, augmentation; :func:`gdacil.data.cache.prefetched`)
        while this process trains. The batch order and the augmentations are still drawn here,
        in the same order, so training is bit-identical for every ``num_workers``; only reading
        an augmented image's size (a file's header) stays in this process.

        Under torch.distributed (see :mod:`gdacil.distributed`) every rank passes the same
        ``raws``, ``labels`` and seed: every rank draws and preprocesses each global batch, runs
        forward and backward on its own contiguous share of it, and the gradients are summed
        over the ranks (:meth:`_shared_backward`), so each update equals single-process
        training on the same global batch up to round-off and the ranks stay identical.

        ``on_step``, if given, is called as ``on_step(step, losses)`` after each optimisation
        step, with ``losses`` mapping ``loss``, ``task_loss`` and ``kd_loss`` to the step's
        values (reading them waits for the device at every step). Under torch.distributed the
        ranks' shares are summed once training ends, so the calls come then, in step order.

        Returns
        -------
        dict
            ``task``, ``strategy``, ``steps``, ``seconds``, ``samples``, ``classes``, and per
            step ``loss`` (total), ``task_loss`` and ``kd_loss`` (lists of floats; ``kd_loss``
            is all zeros without distillation).
        """
        state = self._open_task()
        y = as_labels(labels, n=len(raws))
        cfg, tc = self.config, self.config.train
        log = {"task": state.index, "strategy": cfg.name, "steps": 0, "seconds": 0.0,
               "samples": len(raws), "classes": int(torch.unique(y).numel()),
               "loss": [], "task_loss": [], "kd_loss": []}
        if not state.active or tc.steps == 0:
            return log
        if len(raws) == 0:
            raise ValueError("train_task needs at least one training sample")
        gen = make_generator(generator, name="generator")
        bb = trained_backbone(backbone)
        if bb.precision == "fp16":
            raise ValueError("Stage-1 training in fp16 needs loss scaling, which gdacil does not "
                             "do: train in bf16 or fp32 (backbone precision), extract in any")
        classes, targets = torch.unique(y, return_inverse=True)
        params = dict(bb.model.named_parameters())
        trained = [params[name] for name in state.trained]
        bound = 1.0 / float(np.sqrt(bb.dim))
        head = torch.nn.Parameter(
            torch.empty(len(classes), bb.dim).uniform_(-bound, bound, generator=gen).to(bb.device)
        )
        opt = make_optimization(
            tc.optimizer, trained, [head], lr=tc.lr, head_lr=tc.head_lr, momentum=tc.momentum,
            weight_decay=tc.weight_decay, steps=tc.steps, warmup_ratio=tc.warmup_ratio,
            final_lr_ratio=tc.final_lr_ratio,
        )
        task_loss_fn = LOSSES[tc.loss]
        project = self._projection(params, state.projectors) if state.projectors else None
        losses: list[torch.Tensor] = []  # (total, task, kd) per step, synchronised at the end
        was_training = bb.model.training
        bb.model.eval()  # dropout off: deterministic given the generator
        shared = distributed.world_size() > 1
        batches = self._batches(bb, raws, gen, num_workers)
        start = time.perf_counter()
        try:
            for step, (idx, inputs) in enumerate(batches):
                inputs = {k: v.to(bb.device, non_blocking=True) for k, v in inputs.items()}
                if shared:
                    terms = self._shared_backward(bb, head, inputs, targets[idx], task_loss_fn,
                                                  [*trained, head])
                else:
                    loss, terms = self._batch_loss(bb, head, inputs, targets[idx], task_loss_fn)
                    loss.backward()
                opt.step(project)
                losses.append(terms)
                if on_step is not None and not shared:
                    on_step(step, dict(zip(_LOSS_KEYS, terms.tolist())))
            stacked = torch.stack(losses)
            distributed.all_reduce_sum([stacked])  # the ranks' weighted shares add up
            history: list[list[float]] = stacked.T.tolist()
        finally:
            bb.model.train(was_training)
            for p in trained:
                p.grad = None
        log["seconds"] = time.perf_counter() - start
        log["steps"] = len(losses)
        log["loss"], log["task_loss"], log["kd_loss"] = history
        if on_step is not None and shared:
            for step, values in enumerate(zip(*history)):
                on_step(step, dict(zip(_LOSS_KEYS, values)))
        return log

    def _batch_loss(self, bb: Backbone, head: torch.Tensor, inputs: dict,
                    targets: torch.Tensor, task_loss_fn) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss of a batch (mean over its samples) and its detached terms
        ``(total, task, kd)``."""
        task = cast(_Task, self._task)  # open: train_task calls this
        cfg, tc, teacher = self.config, self.config.train, task.teacher
        with bb.autocast():  # mixed precision for the forward passes; losses in float32
            teacher_features = teacher.features(bb, inputs) if teacher else None
            features = bb.forward(inputs)
            logits = features @ head.T
        features = features.float()
        if teacher_features is not None:
            teacher_features = teacher_features.float()
        task_loss = task_loss_fn(logits.float(), targets.to(bb.device),
                                 lambda1=tc.sce_lambda1, lambda2=tc.sce_lambda2)
        kd = (feature_distillation(features, teacher_features) if teacher_features is not None
              else torch.zeros((), device=bb.device))
        loss = task_loss + cfg.kd_weight * kd
        return loss, torch.stack([loss, task_loss, kd]).detach()

    def _shared_backward(self, bb: Backbone, head: torch.Tensor, inputs: dict,
                         targets: torch.Tensor, task_loss_fn, params: list) -> torch.Tensor:
        """Data-parallel backward of one global batch: this rank takes its contiguous share of
        the rows (:func:`gdacil.distributed.shard_bounds`), weighs its mean loss by the share's
        fraction of the batch, and the gradients of ``params`` are summed over the ranks, so
        every rank holds the gradient of the global batch's mean loss. Returns this rank's
        weighted ``(total, task, kd)``; their sum over the ranks is the batch's."""
        start, stop = distributed.shard_bounds(len(targets))
        weight = (stop - start) / len(targets)
        terms = torch.zeros(3, device=bb.device)
        if weight:  # a rank whose share is empty adds zero gradients
            local = {k: v[start:stop] for k, v in inputs.items()}
            loss, terms = self._batch_loss(bb, head, local, targets[start:stop], task_loss_fn)
            (loss * weight).backward()
            terms = terms * weight
        distributed.all_reduce_grads(params)
        return terms

    def _batches(self, bb: Backbone, raws: Sequence, generator: torch.Generator,
                 num_workers: int) -> Iterable[tuple[torch.Tensor, dict]]:
        """``(indices, model inputs on the CPU)`` of every step: built in this process, or by
        ``num_workers`` workers from the indices and augmentations drawn here, in the order
        this process draws them."""
        tc = self.config.train
        steps = minibatches(len(raws), tc.batch_size, tc.steps, generator)
        if not num_workers:
            return ((idx, self._inputs(bb, [raws[i] for i in idx.tolist()], generator))
                    for idx in steps)
        augment = self._open_task().augment
        plans = ((idx, _draws(map(raws.__getitem__, idx.tolist()), augment, generator))
                 for idx in steps)
        return prefetched(partial(_planned_inputs, bb, raws), plans,
                          num_workers=min(num_workers, tc.steps), device=bb.device)

    def _inputs(self, bb: Backbone, batch: list, generator: torch.Generator) -> dict:
        """Model inputs (CPU) of a training batch, built in this process (augmented if
        configured)."""
        return _build(bb, batch, _draws(batch, self._open_task().augment, generator))

    @staticmethod
    def _projection(params: dict, projectors: dict[str, torch.Tensor]):
        def project():
            with torch.no_grad():
                for name, P in projectors.items():
                    g = params[name].grad
                    if g is not None:  # a 1x1 convolution's (out, in, 1, 1) as (out, in)
                        matrix = linear_weight(g)
                        matrix.copy_(matrix @ P)

        return project

    def end_task(self, backbone: Backbone, raws: Sequence | None = None) -> None:
        """Close the open task: merge LoRA adapters into the weights, restore the parameters'
        ``requires_grad`` flags, drop the teacher and projectors, and (NSP) add the input
        moments of ``raws`` (the task's training samples, evaluation preprocessing) to the
        accumulated moments."""
        state = self._open_task()
        bb = trained_backbone(backbone)
        if state.active:
            if self.config.params == "lora":
                merge_lora(bb)
            restore_trainable(bb.model, state.requires_grad)
        ns = self.config.null_space
        if state.active and ns is not None:
            if raws is None or len(raws) == 0:
                raise ValueError("null-space strategies need the task's training samples in "
                                 "end_task(backbone, raws)")
            linears = block_linears(bb, ("mlp_in", "mlp_out"))
            new = _input_moments(bb, linears, raws, ns.batch_size)
            self.moments_ = {name: accumulate_moments(self.moments_.get(name), new[name], ns)
                             for name in linears}
        self._task = None

    def adapt_task(self, backbone: Backbone, task: int, raws: Sequence, labels, *,
                   generator, on_step: Callable[[int, dict[str, float]], None] | None = None,
                   num_workers: int = 0) -> dict:
        """:meth:`begin_task`, :meth:`train_task` and :meth:`end_task` with one generator (an int
        seed gives one fresh ``torch.Generator`` for the three); returns the training log.
        ``on_step`` and ``num_workers`` go to :meth:`train_task`."""
        gen = make_generator(generator, name="generator")
        self.begin_task(backbone, task, generator=gen)
        log = self.train_task(backbone, raws, labels, generator=gen, on_step=on_step,
                              num_workers=num_workers)
        self.end_task(backbone, raws)
        return log

    def _open_task(self) -> _Task:
        if self._task is None:
            raise RuntimeError("no open task; call begin_task(backbone, task) first")
        return self._task

    # ------------------------------------------------------------------ state
    def nbytes(self) -> int:
        """Bytes of the state kept between tasks (:attr:`moments_`), plus the teacher copy and
        projectors while a task is open."""
        total = sum(t.numel() * t.element_size() for t in self.moments_.values())
        if self._task is not None:
            if self._task.teacher is not None:
                total += self._task.teacher.nbytes()
            total += sum(P.numel() * P.element_size() for P in self._task.projectors.values())
        return total

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict]:
        """``(tensors, metadata)`` to save between tasks (e.g. with
        :func:`gdacil.io.save_tensors`): the NSP moments, and the config as JSON."""
        if self._task is not None:
            raise RuntimeError(f"task {self._task.index} is open; save after end_task")
        tensors = {f"moments/{name}": t for name, t in self.moments_.items()}
        return tensors, {"format": _STATE_FORMAT, "config": self.config.to_dict()}

    def load_state_dict(self, tensors: dict[str, torch.Tensor], metadata: dict, *,
                        source: str = "the state") -> None:
        """Restore what :meth:`state_dict` returned; the saved config must equal this
        strategy's (``ValueError`` naming ``source`` and the differences otherwise)."""
        if self._task is not None:
            raise RuntimeError(f"task {self._task.index} is open; load before begin_task")
        if metadata.get("format") != _STATE_FORMAT:
            raise ValueError(f"{source}: unsupported strategy state format "
                             f"{metadata.get('format')!r}")
        saved, mine = metadata.get("config"), self.config.to_dict()
        if json.dumps(saved, sort_keys=True) != json.dumps(mine, sort_keys=True):
            diff = sorted(k for k in set(saved or {}) | set(mine)
                          if (saved or {}).get(k) != mine.get(k))
            raise ValueError(f"{source}: the saved strategy state belongs to another config "
                             f"(differs in {diff}); build the strategy from the saved config")
        unknown = sorted(k for k in tensors if not k.startswith("moments/"))
        if unknown:
            raise ValueError(f"{source}: unexpected tensors in a strategy state: {unknown}")
        self.moments_ = {k.removeprefix("moments/"): t.to("cpu", torch.float32)
                         for k, t in tensors.items()}
