"""torch.distributed glue: process-group setup, sharding, and exact collectives.

gdacil runs data-parallel under ``torchrun`` (see ``docs/distributed.md``)::

    torchrun --nproc_per_node 2 -m gdacil run my.yaml

Every helper here is a no-op for a single process (no process group, or a group of one), so code
that calls them runs unchanged without ``torchrun``. The collectives move tensors only (no pickled
objects), in a fixed rank order, so every rank ends with bit-identical results:

- :func:`shard` and :func:`all_gather_rows`: each rank computes a contiguous block of rows, and
  every rank gets the whole matrix back in the original order;
- :func:`all_reduce_stats`: per-class statistics of different ranks (different or overlapping
  class sets) merged exactly, by the Chan merges of :class:`~gdacil.stats.ClassGaussians`;
- :func:`all_reduce_sum` and :func:`all_reduce_grads`: sums of tensors and of gradients.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist

from .stats import ClassGaussians

__all__ = [
    "all_gather_rows",
    "all_reduce_grads",
    "all_reduce_stats",
    "all_reduce_sum",
    "barrier",
    "init_from_env",
    "is_initialized",
    "is_main_process",
    "main_process_first",
    "process_group",
    "rank",
    "shard",
    "shard_bounds",
    "world_size",
]

#: Dtypes :func:`all_gather_rows` can move, by the code that travels in its header.
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool)


# ------------------------------------------------------------------ the process group
def is_initialized() -> bool:
    """Whether a default process group exists."""
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """Number of processes in the default group (1 without one)."""
    return dist.get_world_size() if is_initialized() else 1


def rank() -> int:
    """This process's rank in the default group (0 without one)."""
    return dist.get_rank() if is_initialized() else 0


_current_rank = rank  # for functions whose ``rank`` argument hides this one


def is_main_process() -> bool:
    """Whether this is rank 0, the process that writes results, checkpoints and logs."""
    return rank() == 0


def init_from_env(device: torch.device | str | None = None, *, backend: str | None = None,
                  timeout: timedelta | None = None) -> bool:
    """Initialise the default process group from the environment ``torchrun`` sets.

    A no-op (returning ``False``) for a single process (``WORLD_SIZE`` unset or 1) and when a
    group already exists.

    Parameters
    ----------
    device : torch.device or str, optional
        Where the model runs: ``"cuda"`` selects the ``nccl`` backend and makes GPU
        ``LOCAL_RANK`` this process's current device; anything else selects ``gloo``.
    backend : str, optional
        Override the backend choice.
    timeout : datetime.timedelta, optional
        Collective timeout (torch's default when omitted).

    Returns
    -------
    bool
        Whether this call created the group (the caller then destroys it, e.g. with
        :func:`process_group`).
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or is_initialized():
        return False
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    if backend is None:
        backend = "nccl" if device is not None and torch.device(device).type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(backend=backend, **kwargs)
    return True


@contextmanager
def process_group(device: torch.device | str | None = None, *,
                  backend: str | None = None) -> Iterator[None]:
    """``with process_group(device):`` :func:`init_from_env` on entry; destroys the group on
    exit if it was created here."""
    created = init_from_env(device, backend=backend)
    try:
        yield
    finally:
        if created:
            dist.destroy_process_group()


def barrier() -> None:
    """Wait for every rank (no-op for a single process)."""
    if world_size() > 1:
        dist.barrier()


@contextmanager
def main_process_first() -> Iterator[None]:
    """Run the block on rank 0 first, then on the other ranks: for a block that writes a file
    when it is absent and checks it otherwise (rank 0 writes, the others read)."""
    if not is_main_process():
        barrier()
    try:
        yield
    finally:
        if is_main_process():
            barrier()


# ------------------------------------------------------------------ sharding
def shard_bounds(n: int, rank: int | None = None, world: int | None = None) -> tuple[int, int]:
    """``(start, stop)`` of ``rank``'s contiguous share of ``n`` items: the first ``n % world``
    ranks get one item more (the split of :func:`numpy.array_split`)."""
    r = _current_rank() if rank is None else int(rank)
    w = world_size() if world is None else int(world)
    if not 0 <= r < w:
        raise ValueError(f"rank must lie in [0, {w}); got {r}")
    size, extra = divmod(int(n), w)
    start = r * size + min(r, extra)
    return start, start + size + (r < extra)


def shard(items: Sequence, rank: int | None = None, world: int | None = None) -> Sequence:
    """``rank``'s contiguous slice of ``items`` out of ``world`` (default: this process's rank
    and the group's size); concatenating the slices of ranks ``0 .. world-1`` gives ``items``.

    Examples
    --------
    >>> [shard(list(range(5)), r, 2) for r in range(2)]
    [[0, 1, 2], [3, 4]]
    """
    start, stop = shard_bounds(len(items), rank, world)
    return items[start:stop]


# ------------------------------------------------------------------ collectives
def _comm_device() -> torch.device:
    """Where collective buffers must live: the current GPU for nccl, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _gather(t: torch.Tensor) -> list[torch.Tensor]:
    """``t`` of every rank (same shape and dtype everywhere), in rank order, on ``t``'s device."""
    buf = t.contiguous().to(_comm_device())
    out = [torch.empty_like(buf) for _ in range(world_size())]
    dist.all_gather(out, buf)
    return [o.to(t.device) for o in out]


def _gather_ints(*values: int) -> torch.Tensor:
    """``values`` of every rank as an int64 tensor ``(world, len(values))``."""
    return torch.stack(_gather(torch.tensor(values, dtype=torch.int64)))


def _pad_rows(t: torch.Tensor, rows: int, value=0) -> torch.Tensor:
    """``t`` with rows of ``value`` appended up to ``rows`` rows."""
    pad = t.new_full((rows - t.shape[0], *t.shape[1:]), value)
    return torch.cat([t, pad])


def all_gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's block of rows in rank order; every rank gets the whole matrix.

    The blocks may have different numbers of rows (also zero); the trailing shape and dtype must
    agree across ranks. With :func:`shard`'s blocks this restores the original row order.

    Parameters
    ----------
    tensor : torch.Tensor
        This rank's rows, shape ``(n_rank, ...)``.

    Returns
    -------
    torch.Tensor
        ``(sum of n_rank, ...)`` on ``tensor``'s device; ``tensor`` itself for one process.
    """
    if world_size() == 1:
        return tensor
    if tensor.ndim == 0 or tensor.dtype not in _DTYPES:
        raise ValueError(f"all_gather_rows needs a tensor with rows of a dtype in {_DTYPES}; "
                         f"got shape {tuple(tensor.shape)} and {tensor.dtype}")
    row = tensor.shape[1:]
    header = _gather_ints(tensor.shape[0], row.numel(), tensor.ndim, _DTYPES.index(tensor.dtype))
    if len(set(map(tuple, header[:, 1:].tolist()))) != 1:
        raise ValueError(f"all_gather_rows: ranks hold rows of different shapes or dtypes "
                         f"(row size, ndim, dtype code per rank: {header[:, 1:].tolist()})")
    sizes = header[:, 0].tolist()
    if max(sizes) == 0:
        return tensor
    blocks = _gather(_pad_rows(tensor, max(sizes)))
    return torch.cat([b[:n] for b, n in zip(blocks, sizes)])


def all_reduce_sum(tensors: Sequence[torch.Tensor]) -> None:
    """Replace every tensor by its sum over the ranks, in place (one coalesced collective;
    no-op for one process). The sum is taken in the tensors' common dtype."""
    if world_size() == 1 or not tensors:
        return
    flat = torch.cat([t.detach().reshape(-1) for t in tensors]).to(_comm_device())
    dist.all_reduce(flat)
    start = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[start : start + t.numel()].view_as(t))
            start += t.numel()


def all_reduce_grads(params: Sequence[torch.nn.Parameter]) -> None:
    """Sum the gradients of ``params`` over the ranks, in place; a missing gradient counts as
    zero (and is set). With each rank's loss weighted by its share of the global batch, the sum
    is the gradient of the global batch's mean loss."""
    if world_size() == 1:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    all_reduce_sum([cast(torch.Tensor, p.grad) for p in params])  # every one set above


def all_reduce_stats(stats: ClassGaussians) -> ClassGaussians:
    """Merge every rank's class statistics exactly; every rank gets bit-identical results.

    Ranks may hold different or overlapping classes. Each rank's labels, counts, means and
    covariances travel as padded tensors (after a header with every rank's ``dim``, ``ddof``
    and class count); every rank then merges them in rank order with
    :meth:`ClassGaussians.merge` (Chan's pairwise update), so the result equals the statistics
    of the union of the ranks' samples up to round-off. Classes are ordered by first
    appearance in rank order.

    Parameters
    ----------
    stats : ClassGaussians
        This rank's statistics (not modified).

    Returns
    -------
    ClassGaussians
        The merged statistics, on ``stats.device``; a copy of ``stats`` for one process.

    Raises
    ------
    TypeError
        ``stats`` is not a dense :class:`ClassGaussians` (e.g. low-rank statistics).
    ValueError
        The ranks' statistics differ in ``dim`` or ``ddof`` (on every rank, naming the values).
    """
    if not isinstance(stats, ClassGaussians):
        raise TypeError(f"all_reduce_stats merges dense ClassGaussians; got {type(stats).__name__}")
    if world_size() == 1:
        return stats.copy()
    header = _gather_ints(stats.dim, stats.ddof, stats.n_classes)
    for column, what in ((0, "dim"), (1, "ddof")):
        values = header[:, column].tolist()
        if len(set(values)) != 1:
            raise ValueError(f"all_reduce_stats: the ranks' statistics differ in {what}: "
                             f"{values} (rank order)")
    sizes = header[:, 2].tolist()
    k = max(sizes)
    out = ClassGaussians(stats.dim, ddof=stats.ddof, device=stats.device)
    if k == 0:
        return out
    labels = _gather(_pad_rows(torch.tensor(stats.classes, dtype=torch.int64), k, -1))
    counts = _gather(_pad_rows(stats.counts, k, 1.0))
    means = _gather(_pad_rows(stats.means, k))
    covs = _gather(_pad_rows(stats.covariances(), k))
    for n, lab, cnt, mu, cov in zip(sizes, labels, counts, means, covs):
        if n:
            out.merge(ClassGaussians.from_moments(lab[:n].tolist(), mu[:n], cov[:n], cnt[:n],
                                                  ddof=stats.ddof, device=stats.device))
    return out
