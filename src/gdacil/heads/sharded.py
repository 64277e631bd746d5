"""A head whose classes are split over the processes of a torch.distributed group.

Each rank holds the statistics and the head rows of its own classes only, so the memory per
process falls with the number of processes. What a class's rows depend on beyond its own
statistics, the average class covariance ``Sigma_avg`` (LDA's shared covariance, the base ``B``
of RGDA and LR-RGDA), the number of classes and the total count (the priors), is summed over the
ranks first (:class:`~gdacil.heads.base.ModelTerms`), so every rank builds, for its classes, the
rows one process holding every class would build.

A prediction needs the same samples on every rank. Each rank scores its classes and keeps its
``k`` best (LR-RGDA with its exact pruned top-k); the ``k`` candidates of every rank are gathered
and merged, which is exact: a sample's global top ``k`` are among the union of the ranks' top
``k``. Probabilities divide by the global normaliser, the log-sum-exp of the ranks'
log-sum-exps. New classes go to the ranks holding the fewest (:meth:`ShardedHead.assign`).

Run it under ``torchrun`` with any backend (gloo on CPU); without a process group it is one
shard holding every class.
"""

from __future__ import annotations

import copy

import torch

from .. import distributed
from ..stats import ClassStatistics
from .base import GaussianHead, ModelTerms, classes_to_forget, refit_or_unfit
from .lda import LDA
from .lowrank import LRRGDA
from .ncm import NCM
from .rgda import QDA, RGDA

__all__ = ["ShardedHead"]

#: Heads whose rows depend on other classes only through :class:`ModelTerms`
SHARDABLE = (NCM, LDA, QDA, RGDA, LRRGDA)


class ShardedHead:
    """One head's classes split over the ranks of the default process group.

    Parameters
    ----------
    head : NCM, LDA, QDA, RGDA or LRRGDA
        An unfitted head: its parameters are every shard's. Priors must be None or "empirical".

    Attributes
    ----------
    head_ : GaussianHead or None
        This rank's head over :attr:`local_classes_` (None while this rank holds no class).
    classes_ : torch.Tensor
        Every class of the model, rank by rank.
    local_classes_ : torch.Tensor
        This rank's classes.
    model_terms_ : ModelTerms
        The terms summed over the ranks.

    Examples
    --------
    Each of ``torchrun --nproc_per_node 2`` processes runs::

        from gdacil import ClassGaussians
        from gdacil.heads import LRRGDA, ShardedHead

        sharded = ShardedHead(LRRGDA(rank=64))
        mine = [c for c, r in zip(labels, sharded.assign(labels)) if r == distributed.rank()]
        stats = ClassGaussians(768).update(X[keep(mine)], y[keep(mine)])  # its classes only
        sharded.fit(stats)
        scores, labels, probabilities = sharded.top_k(queries, 5, proba=True)  # same everywhere

    Without a process group it is one shard:

    >>> import torch
    >>> from gdacil import ClassGaussians
    >>> from gdacil.heads import LDA, ShardedHead
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(60, 3, generator=g, dtype=torch.float64) + torch.arange(60)[:, None] % 3
    >>> stats = ClassGaussians(3).update(X, torch.arange(60) % 3)
    >>> sharded = ShardedHead(LDA()).fit(stats)
    >>> bool((sharded.predict(X) == LDA().fit(stats).predict(X)).all())
    True
    """

    #: The novelty score ``score_samples`` computes when none is named
    default_novelty = "msp"

    def __init__(self, head: GaussianHead):
        self.head = head

    def _check_head(self) -> None:
        if type(self.head) not in SHARDABLE:
            names = ", ".join(h.__name__ for h in SHARDABLE)
            raise TypeError(f"ShardedHead takes one of {names}; got {type(self.head).__name__} "
                            "(its rows depend on other classes in ways a shard cannot see)")
        if self.head.priors not in (None, "empirical"):
            raise ValueError("a sharded head takes priors None or 'empirical'; got "
                             f"{self.head.priors!r}")

    # ------------------------------------------------------------------ placement
    def assign(self, labels) -> list[int]:
        """The rank each new class in ``labels`` should go to: the one holding the fewest classes
        (ties to the lowest rank), counting the ones assigned before it. Classes the model holds
        keep their rank. Every rank gets the same answer from the same ``labels``."""
        held = getattr(self, "local_classes_", torch.empty(0, dtype=torch.int64))
        loads = distributed.all_gather_rows(torch.tensor([len(held)])).tolist()
        owner = self._owners()
        out = []
        for c in (int(c) for c in labels):
            if c not in owner:
                owner[c] = min(range(len(loads)), key=lambda r: (loads[r], r))
                loads[owner[c]] += 1
            out.append(owner[c])
        return out

    def _owners(self) -> dict[int, int]:
        if not hasattr(self, "classes_"):
            return {}
        return {int(c): r for r, block in enumerate(self._blocks) for c in block.tolist()}

    # ------------------------------------------------------------------ fitting
    def fit(self, stats: ClassStatistics) -> ShardedHead:
        """Build this rank's shard from its classes' statistics (a collective: every rank calls
        it). Ranks must hold different classes. Returns ``self``."""
        self._check_head()
        if not isinstance(stats, ClassStatistics):
            raise TypeError(f"fit expects ClassGaussians or LowRankGaussians; got "
                            f"{type(stats).__name__}")
        mine = torch.tensor(stats.classes, dtype=torch.int64)
        blocks = self._gather_blocks(mine)
        everything = torch.cat(blocks)
        if everything.numel() == 0:
            raise ValueError("ShardedHead.fit: no rank holds any class")
        if everything.unique().numel() != everything.numel():
            seen = [c for c in everything.tolist() if (everything == c).sum() > 1]
            raise ValueError(f"ShardedHead.fit: classes held by more than one rank: "
                             f"{sorted(set(seen))[:10]} (merge them onto one rank first)")
        terms = self._model_terms(stats)
        if float(terms.average_covariance.trace()) <= 0.0:
            raise ValueError("ShardedHead.fit: no class has within-class variance (one sample "
                             "each?); the identity term's scale would differ between shards")
        head = getattr(self, "head_", None)  # refitted: LR-RGDA keeps unchanged classes' eigenpairs
        if stats.n_classes:
            head = copy.deepcopy(self.head) if head is None else head
            head.fit(stats, model_terms=terms)
        else:
            head = None
        self.head_, self.model_terms_ = head, terms
        self._blocks, self.classes_, self.local_classes_ = blocks, everything, mine
        return self

    def forget(self, classes, stats: ClassStatistics) -> ShardedHead:
        """Forget ``classes`` of the model (a collective: every rank calls it with the same
        ``classes`` and its own statistics): each rank removes those it holds from ``stats``
        (in place), then every shard is refitted on the terms of the classes left, as
        :meth:`fit` would fit them. Returns ``self``.

        A label the model does not hold raises a ``ValueError`` naming it, on every rank, before
        anything changes. Forgetting every class leaves the sharded head unfitted; a refit that
        fails leaves it unfitted too (see :meth:`GaussianHead.forget
        <gdacil.heads.base.GaussianHead.forget>`).

        Examples
        --------
        >>> import torch
        >>> from gdacil import ClassGaussians
        >>> from gdacil.heads import LDA, ShardedHead
        >>> g = torch.Generator().manual_seed(0)
        >>> X, y = torch.randn(60, 3, generator=g, dtype=torch.float64), torch.arange(60) % 3
        >>> stats = ClassGaussians(3).update(X, y)
        >>> ShardedHead(LDA()).fit(stats).forget([1], stats).classes_.tolist()
        [0, 2]
        """
        self._check_fitted()
        labels = classes_to_forget(self, classes, self.classes_.tolist())
        if not labels:
            return self
        stats.remove_classes([c for c in labels if c in stats])
        refit_or_unfit(self, lambda: self.fit(stats), len(labels) < len(self.classes_))
        return self

    @staticmethod
    def _gather_blocks(mine: torch.Tensor) -> list[torch.Tensor]:
        sizes = distributed.all_gather_rows(torch.tensor([mine.numel()])).tolist()
        labels = distributed.all_gather_rows(mine)
        return list(torch.split(labels, sizes))

    @staticmethod
    def _model_terms(stats: ClassStatistics) -> ModelTerms:
        C = stats.n_classes
        total = (stats.average_covariance() * C if C else
                 torch.zeros(stats.dim, stats.dim, dtype=torch.float64))
        sums = torch.cat([total.reshape(-1).to(torch.float64),
                          torch.tensor([C, float(stats.counts.sum()) if C else 0.0],
                                       dtype=torch.float64)])
        distributed.all_reduce_sum([sums])
        d = stats.dim
        n_classes = int(sums[d * d])
        avg = sums[: d * d].reshape(d, d) / max(n_classes, 1)
        return ModelTerms(0.5 * (avg + avg.T), n_classes, float(sums[d * d + 1]))

    # ------------------------------------------------------------------ prediction
    def _check_fitted(self) -> None:
        if not hasattr(self, "classes_"):
            from ..errors import NotFittedError

            raise NotFittedError("this ShardedHead is not fitted yet; call fit(stats) first")

    def _local(self, X: torch.Tensor, k: int, proba: bool):
        """This rank's ``k`` best (scores, labels; padded with -inf and -1) and, with ``proba``,
        its log-sum-exp over its classes (-inf without classes)."""
        n = X.shape[0]
        scores = torch.full((n, k), -torch.inf, dtype=torch.float64)
        labels = torch.full((n, k), -1, dtype=torch.int64)
        lse = torch.full((n,), -torch.inf, dtype=torch.float64)
        if self.head_ is None:
            return scores, labels, lse
        j = min(k, len(self.local_classes_))
        if proba or not isinstance(self.head_, LRRGDA):
            all_scores = self.head_.decision_function(X).to(torch.float64).cpu()
            best, where = all_scores.topk(j, dim=1)
            found = self.head_.classes_[where]
            if proba:
                lse = torch.logsumexp(all_scores, dim=1)
        else:
            best, found = self.head_.top_k(X, j)
            best, found = best.to(torch.float64).cpu(), found.cpu()
        scores[:, :j], labels[:, :j] = best, found
        return scores, labels, lse

    def top_k(self, X, k: int = 5, *, proba: bool = False):
        """The ``k`` best classes of every sample over all ranks, best first (a collective;
        ``X`` must be the same on every rank).

        Returns ``(scores, labels)``, each ``(n, k)`` (``k`` at most the number of classes), and
        with ``proba`` also the probabilities of those classes under the softmax over every
        class of every rank. Scores are the heads' decision values (float64).
        """
        self._check_fitted()
        k = min(int(k), len(self.classes_))
        if k < 1:
            raise ValueError(f"k must be a positive integer; got {k!r}")
        X = torch.as_tensor(X)
        scores, labels, lse = self._local(X, k, proba)
        world = distributed.world_size()
        n = X.shape[0]
        every = distributed.all_gather_rows(torch.stack([scores, labels.to(torch.float64)])[None])
        # (world, 2, n, k) -> candidates (n, world * k), ranks in order
        cand_scores = every[:, 0].permute(1, 0, 2).reshape(n, world * k)
        cand_labels = every[:, 1].permute(1, 0, 2).reshape(n, world * k).to(torch.int64)
        best, where = cand_scores.topk(k, dim=1)
        found = cand_labels.gather(1, where)
        if not proba:
            return best, found
        total = torch.logsumexp(distributed.all_gather_rows(lse[None]), dim=0)
        return best, found, (best - total[:, None]).exp()

    def score_samples(self, X, method: str | None = None) -> torch.Tensor:
        """Novelty scores over all ranks (a collective; :mod:`gdacil.novelty`): ``"msp"`` (the
        default here) or ``"energy"``, from the ranks' best scores and log-sum-exps. The
        distance scores need every class's mean in one process: score with a head fitted on
        the gathered statistics (:func:`gdacil.distributed.all_reduce_stats`) for those."""
        from ..novelty import LOGIT_SCORES, check_method

        method = check_method(method, LOGIT_SCORES, default=self.default_novelty)
        best, _, proba = self.top_k(X, 1, proba=True)
        if method == "msp":
            return proba[:, 0].to(torch.float64)
        return (best[:, 0] - proba[:, 0].log()).to(torch.float64)  # the global log-sum-exp

    def predict(self, X) -> torch.Tensor:
        """The best class of every sample over all ranks (a collective)."""
        return self.top_k(X, 1)[1][:, 0]

    def memory_report(self) -> dict[str, int]:
        """Bytes this rank's shard holds (its head's report; empty without classes)."""
        self._check_fitted()
        return self.head_.memory_report() if self.head_ is not None else {}
