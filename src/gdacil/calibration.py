"""Open-set calibration from samples of the current task: a rejection threshold with a stated
false-rejection rate, a temperature for calibrated probabilities, and split-conformal prediction
sets.

All three are fitted on *calibration records*: samples of the task just learned, each scored by
a copy of the head that did not learn it (:func:`held_out_calibration`; by default cross-fitted,
:func:`calibration_folds`: each fold of the task's samples is scored by the head refitted
without it, so every sample is a record). :meth:`Calibration.fit` takes their novelty scores,
labels and class scores. No sample of an earlier task is kept or needed.

- **Rejection.** :meth:`Calibration.threshold` for a target false-rejection rate ``rate`` is the
  ``floor(rate (n + 1))``-th smallest of the ``n`` records' novelty scores, so a new known input,
  exchangeable with the records, is rejected with probability at most ``rate`` (and at least
  ``rate - 1 / (n + 1)``).
- **Temperature.** ``temperature_`` minimises the negative log-likelihood of the records' labels
  under ``softmax(g / T)`` [TempScaling], pulled towards ``T = 1`` by :data:`TEMPERATURE_PRIOR`
  records' worth (records all classified right would otherwise drive ``T`` to 0);
  :func:`expected_calibration_error` measures the result.
- **Conformal sets.** :meth:`Calibration.prediction_sets` keeps every class whose calibrated
  probability is at least ``1 - q``, with ``q`` the ``ceil((n + 1)(1 - alpha))``-th smallest
  non-conformity ``1 - p_y`` of the records [Conformal]: for a new input exchangeable with them
  the set holds its true class with probability at least ``1 - alpha`` (split conformal); the
  best class is always in it.

The guarantees hold for inputs exchangeable with the records, i.e. of the task's classes; for the
classes of earlier tasks they hold as far as tasks resemble each other. A task with fewer than
:data:`MIN_RECORDS` records is joined by the newest records of earlier tasks (``previous``, up
to that many): fewer records would make the quantiles and the temperature noisy, but earlier
records were scored by the head of their own time, against fewer classes, so they are too
confident for the current head and only fill in for small tasks. Records keep each
sample's label, novelty score, its ``top`` best class scores (with the true class's) and the
largest class label of the head that scored it.

Forgetting classes (:meth:`Calibration.forget`) drops their records and every record that a
head holding one of them scored: those records' scores and novelty depend on the classes'
statistics (through the shared terms of the head, such as LR-RGDA's base), so keeping them
would keep a trace of the classes. With labels numbered in the order the classes were learned
(as the Learner numbers them), a head held exactly the classes up to its largest label, and the
records left are those a head that never learned the classes would have made.

Examples
--------
>>> import torch
>>> g = torch.Generator().manual_seed(0)
>>> logits = 3.0 * torch.randn(500, 4, generator=g, dtype=torch.float64)
>>> labels = torch.multinomial(torch.softmax(logits, 1), 1, generator=g)[:, 0]
>>> cal = Calibration().fit(torch.randn(500, dtype=torch.float64, generator=g), labels,
...                         2.0 * logits, torch.arange(4))          # scores twice too confident
>>> round(cal.temperature_, 1)
2.0
>>> sets = cal.prediction_sets(logits, alpha=0.1)                 # (n, C) boolean
>>> bool(sets[torch.arange(500), labels].double().mean() >= 0.85)
True
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from ._validation import all_finite, check_fraction, first_nonfinite
from .novelty import DISTANCE_DEFAULT, check_method
from .state import Stateful

__all__ = [
    "CALIBRATION_SHARE",
    "MAX_RECORDS",
    "MIN_RECORDS",
    "TEMPERATURE_PRIOR",
    "TOP_LABEL_PRIOR",
    "Calibration",
    "calibration_folds",
    "conformal_quantile",
    "ece_floor",
    "expected_calibration_error",
    "fit_temperature",
    "fit_top_label",
    "held_out_calibration",
    "lower_quantile",
    "new_input_calibration",
    "top_label_probabilities",
    "without_samples",
]

#: Class scores kept per record (the best ones, plus the true class's)
TOP = 64
#: Records kept: the newest, those of the latest task first (about 1 KB each)
MAX_RECORDS = 2000
#: Weight of the pull of the top-label map towards the identity, in records
TOP_LABEL_PRIOR = 10.0
#: Weight of the pull of ``1 / T`` towards 1, in records (:func:`fit_temperature`)
TEMPERATURE_PRIOR = 10.0
#: Share of each class's samples that each fold of a learn's cross-fitting holds out (the
#: Learner's default ``calibration_share``): ten folds
CALIBRATION_SHARE = 0.1
#: Fewer held-out records than this in a task: the newest of earlier tasks join them (up to
#: this many). Earlier records were scored against fewer classes, so they are overconfident for
#: the current head; they are a fallback for small tasks only
MIN_RECORDS = 100


def records_for_rate(rate: float) -> int | None:
    """The fewest records ``n`` for which :func:`lower_quantile` gives a finite threshold at
    ``rate`` (``floor(rate (n + 1)) >= 1``), in closed form; None when it is beyond any count
    (``1 / rate`` overflows a float)."""
    check_fraction(rate, "rate")
    inverse = 1.0 / rate
    if math.isinf(inverse):
        return None
    count = max(math.ceil(inverse), 1)  # n + 1
    # 1 / rate is rounded: look at the neighbouring counts (a bounded search; beyond 2**53 a
    # neighbour is the next float, not the next integer)
    for _ in range(4):
        if math.floor(rate * count) < 1:
            count = max(count + 1, math.ceil(math.nextafter(float(count), math.inf)))
        elif count > 1 and math.floor(rate * (count - 1)) >= 1:
            count -= 1
        else:
            break
    return count - 1


def least_rate(n: int, decimals: int = 3) -> float:
    """The smallest rate with ``decimals`` decimals at which ``n`` records give a finite
    threshold (``floor(rate (n + 1)) >= 1``), in closed form."""
    step = 10.0 ** -decimals
    units = max(math.ceil(1 / ((n + 1) * step)), 1)
    if math.floor(units * step * (n + 1)) < 1:  # round-off in the division
        units += 1
    return round(units * step, decimals)


def lower_quantile(values: torch.Tensor, rate: float) -> float:
    """The ``floor(rate (n + 1))``-th smallest of ``values`` (``-inf`` when that is 0): a
    threshold below which a new exchangeable value falls with probability at most ``rate``."""
    k = math.floor(rate * (values.numel() + 1))
    return -math.inf if k < 1 else float(values.sort().values[k - 1])


def conformal_quantile(nonconformity: torch.Tensor, alpha: float) -> float:
    """Split-conformal ``q``: the ``ceil((n + 1)(1 - alpha))``-th smallest non-conformity
    (``inf`` when that exceeds ``n``: too few records for ``alpha``, every class is kept)."""
    n = nonconformity.numel()
    k = math.ceil((n + 1) * (1.0 - alpha))
    return math.inf if k > n else float(nonconformity.sort().values[k - 1])


def expected_calibration_error(proba: torch.Tensor, labels: torch.Tensor, bins: int = 15) -> float:
    """ECE of the top-class confidence: the mean over equal-width confidence bins, weighted by
    their share of samples, of ``|accuracy - confidence|``. ``labels`` are column positions of
    ``proba`` (not class labels)."""
    confidence, predicted = proba.max(1)
    correct = (predicted == labels.to(predicted.device)).double()
    which = (confidence.double() * bins).clamp(max=bins - 1).long()
    total = 0.0
    for b in which.unique().tolist():
        inside = which == b
        total += float(inside.sum()) * abs(float(correct[inside].mean())
                                           - float(confidence[inside].double().mean()))
    return total / max(len(labels), 1)


def ece_floor(proba: torch.Tensor, bins: int = 15, draws: int = 100, seed: int = 0) -> float:
    """The mean :func:`expected_calibration_error` of a perfectly calibrated model with these
    probabilities ``(n, C)``: labels drawn from ``proba`` itself ``draws`` times (with
    ``seed``). The binned ECE is biased upwards on few inputs; measured ECEs near this floor
    cannot tell calibration errors from sampling noise."""
    g = torch.Generator().manual_seed(int(seed))
    p = proba.to(torch.float64).cpu()
    return sum(expected_calibration_error(p, torch.multinomial(p, 1, generator=g)[:, 0], bins)
               for _ in range(draws)) / draws


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor,
                    prior: float = TEMPERATURE_PRIOR) -> float:
    """The temperature ``T`` minimising the negative log-likelihood of ``labels`` (column
    positions) under ``softmax(logits / T)``, summed over the records, plus
    ``prior / 2 (1 / T - 1)^2``: a pull towards ``T = 1`` that keeps ``T`` finite when every
    record is right (the likelihood alone then grows without bound as ``T`` falls to 0, and
    would make every probability 0 or 1). Both terms are convex in ``1 / T``, so the objective
    is unimodal in ``log T``: golden-section search on ``log T`` in ``[-6, 6]``."""
    z = logits.to(torch.float64)
    true = z.gather(1, labels.view(-1, 1).to(z.device))[:, 0]

    def objective(log_t: float) -> float:
        inverse = math.exp(-log_t)
        nll = float(((z * inverse).logsumexp(1) - true * inverse).sum())
        return nll + 0.5 * prior * (inverse - 1.0) ** 2

    lo, hi = -6.0, 6.0
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = objective(a), objective(b)
    for _ in range(80):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = objective(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = objective(b)
    return math.exp((lo + hi) / 2.0)


def fit_top_label(confidence: torch.Tensor, correct: torch.Tensor,
                  prior: float = TOP_LABEL_PRIOR) -> tuple[float, float]:
    """``(a, b)`` of the logistic map ``sigmoid(a logit(p) + b)`` from top-class probabilities
    ``p`` to the chance that the top class is right [TopLabel]: the maximum of the records'
    log-likelihood less ``prior / 2 ((a - 1)^2 + b^2)``, a pull towards the identity map that a
    few records (or records all right) cannot overturn (Newton's method)."""
    p = confidence.to(torch.float64).clamp(1e-12, 1.0 - 1e-12)
    z = torch.stack([torch.logit(p), torch.ones_like(p)], 1)
    t = correct.to(torch.float64)
    identity = torch.tensor([1.0, 0.0], dtype=torch.float64)
    w = identity.clone()
    for _ in range(100):
        q = torch.sigmoid(z @ w)
        grad = z.T @ (q - t) + prior * (w - identity)
        hess = (z.T * (q * (1.0 - q))) @ z + prior * torch.eye(2, dtype=torch.float64)
        step = torch.linalg.solve(hess, grad)
        w = w - step
        if float(step.abs().max()) < 1e-10:
            break
    return float(w[0]), float(w[1])


def top_label_probabilities(proba: torch.Tensor, top_label) -> torch.Tensor:
    """``proba`` ``(n, C)`` with each row's top probability ``p`` mapped to
    ``sigmoid(a logit(p) + b)`` and the others scaled to sum to one with it (their ratios kept);
    the top class stays on top."""
    a, b = top_label
    top, at = proba.max(1)
    p = top.clamp(1e-12, 1.0 - 1e-12)
    mapped = torch.sigmoid(a * torch.logit(p) + b)
    if proba.shape[1] > 1:  # never below the runner-up after rescaling
        second = proba.topk(2, dim=1).values[:, 1]
        mapped = torch.maximum(mapped, second / (1.0 - top + second).clamp_min(1e-300))
    rest = (1.0 - mapped) / (1.0 - top).clamp_min(1e-300)
    out = proba * rest[:, None]
    out.scatter_(1, at[:, None], mapped[:, None])
    return out


def best_scores(scores: torch.Tensor, classes: torch.Tensor,
                labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's best ``min(TOP, C)`` class scores of ``scores`` ``(n, C)`` and their classes
    (``classes`` ``(n, C)``), the true class's (``labels`` ``(n,)``) always among them."""
    is_true = classes == labels[:, None]
    missing = sorted(set(labels[~is_true.any(1)].tolist()))
    if missing:
        raise ValueError(f"calibration records of classes the head lacks: {missing[:5]}")
    true_col = is_true.double().argmax(1)
    top = scores.topk(min(TOP, scores.shape[1]), dim=1).indices
    has_true = (top == true_col[:, None]).any(1)
    top[~has_true, -1] = true_col[~has_true]
    return scores.gather(1, top), classes.gather(1, top)


class Calibration(Stateful):
    """Rejection threshold, temperature and conformal quantiles of one task's held-out records.

    Fitted state: ``novelty_`` ``(n,)`` (the records' novelty scores), ``labels_`` ``(n,)``,
    ``scores_`` ``(n, k)`` and ``score_classes_`` ``(n, k)`` (each record's best ``k <= TOP``
    class scores and their labels, the true class's among them), ``temperature_``,
    ``nonconformity_`` ``(n,)`` (``1 - p_y`` at that temperature, over the kept classes) and
    ``top_label_`` (``[a, b]`` of :func:`fit_top_label`), ``scored_by_`` ``(n,)`` (the
    largest class label among the columns of the head that scored each record) and ``method_``
    (the novelty score of ``novelty_``, :mod:`gdacil.novelty`: new inputs must be scored with
    it).
    """

    _state_attributes: ClassVar[tuple[str, ...]] = (
        "novelty_", "labels_", "scores_", "score_classes_", "temperature_", "nonconformity_",
        "top_label_", "scored_by_", "method_")

    def fit(self, novelty: torch.Tensor, labels: torch.Tensor, scores: torch.Tensor,
            classes: torch.Tensor, *, previous: Calibration | None = None,
            max_records: int = MAX_RECORDS, method: str = DISTANCE_DEFAULT) -> Calibration:
        """Fit from records: ``novelty`` ``(n,)`` (the novelty score ``method``), ``labels``
        ``(n,)``, the head's class scores ``scores`` ``(n, C)`` with columns labelled by
        ``classes`` ``(C,)`` (or by each row's own labels, ``(n, C)``, ``-1`` where a column
        holds no class); with ``previous`` (the calibration of earlier tasks, if its records
        were scored with the same ``method``), its newest records join them up to
        ``max_records`` in all (these records are always kept). Returns ``self``."""
        labels = torch.as_tensor(labels, dtype=torch.int64).reshape(-1)
        classes = torch.as_tensor(classes, dtype=torch.int64)
        scores = scores.to(torch.float64).cpu()
        if classes.dim() == 1:
            classes = classes.expand(scores.shape[0], -1)
        same = novelty.numel() == labels.numel() == scores.shape[0]
        if not same or classes.shape != scores.shape:
            raise ValueError("calibration records: novelty, labels and scores must describe the "
                             "same samples, and scores have one column per class")
        if not labels.numel():
            raise ValueError("calibration needs at least one held-out record")
        self.scores_, self.score_classes_ = best_scores(scores, classes, labels)
        self.scored_by_ = classes.amax(1).clone()
        self.labels_ = labels
        self.novelty_ = novelty.to(torch.float64).cpu().reshape(-1)
        self._check_novelty("calibration records")
        self.method_ = check_method(method)
        if previous is not None and previous.method_ == self.method_:
            self._prepend(previous, max(0, int(max_records) - self.n_records))
        return self._refit()

    def _prepend(self, older: Calibration, room: int) -> None:
        """Put the newest ``room`` records of ``older`` before these (class scores padded)."""
        start = max(0, older.n_records - room)
        width = max(self.scores_.shape[1], older.scores_.shape[1])

        def padded(t: torch.Tensor, fill) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)

        self.scores_ = torch.cat([padded(older.scores_[start:], -math.inf),
                                  padded(self.scores_, -math.inf)])
        self.score_classes_ = torch.cat([padded(older.score_classes_[start:], -1),
                                         padded(self.score_classes_, -1)])
        self.labels_ = torch.cat([older.labels_[start:], self.labels_])
        self.novelty_ = torch.cat([older.novelty_[start:], self.novelty_])
        self.scored_by_ = torch.cat([older.scored_by_[start:], self.scored_by_])

    def _refit(self) -> Calibration:
        true = self.score_classes_ == self.labels_[:, None]
        self.temperature_ = fit_temperature(self.scores_, true.double().argmax(1))
        p = torch.softmax(self.scores_ / self.temperature_, 1)
        self.nonconformity_ = 1.0 - (p * true).sum(1)
        top, at = p.max(1)
        self.top_label_ = list(fit_top_label(top, true.gather(1, at[:, None])[:, 0]))
        return self

    # ------------------------------------------------------------------ use
    def threshold(self, rate: float = 0.05) -> float:
        """Novelty score below which an input is rejected, for a false-rejection rate of at most
        ``rate`` on inputs exchangeable with the records."""
        check_fraction(rate, "rate")
        return lower_quantile(self.novelty_, rate)

    def tempered(self, scores: torch.Tensor) -> torch.Tensor:
        """``softmax(scores / T)`` of class scores ``(n, C)``: what the conformal sets use."""
        return torch.softmax(scores.to(torch.float64) / self.temperature_, 1)

    def calibrated(self, scores: torch.Tensor) -> torch.Tensor:
        """Calibrated probabilities of class scores ``(n, C)``: :meth:`tempered`, then the
        top class's probability mapped by the records' top-label fit
        (:func:`top_label_probabilities`)."""
        return top_label_probabilities(self.tempered(scores), self.top_label_)

    def quantile(self, alpha: float = 0.1) -> float:
        """The conformal ``q`` for miscoverage ``alpha``."""
        check_fraction(alpha, "alpha")
        return conformal_quantile(self.nonconformity_, alpha)

    def prediction_sets(self, scores: torch.Tensor, alpha: float = 0.1) -> torch.Tensor:
        """Boolean ``(n, C)``: the classes of each conformal set (class scores ``(n, C)``).
        The best class is always in the set (a superset keeps the guarantee; records all
        classified right by wide margins give ``q`` near 0, which would leave sets empty)."""
        proba = self.tempered(scores)
        sets = proba >= 1.0 - self.quantile(alpha)
        sets[torch.arange(len(proba)), proba.argmax(1)] = True
        return sets

    # ------------------------------------------------------------------ forgetting
    def forget(self, classes) -> Calibration | None:
        """Drop every record scored by a head that held one of ``classes`` (``scored_by_`` at
        least the smallest of them; see the module's notes), their own records included, and
        refit; ``None`` when no record is left."""
        drop = torch.as_tensor(list(classes), dtype=torch.int64)
        if not drop.numel():
            return self
        keep = self.scored_by_ < drop.min()  # a record's head held its own class
        if not bool(keep.any()):
            return None
        # the records left may be older ones, padded to a newer record's width: trim it
        width = int((self.score_classes_[keep] >= 0).any(0).nonzero().max()) + 1
        self.scores_ = self.scores_[keep, :width]
        self.score_classes_ = self.score_classes_[keep, :width]
        self.labels_, self.novelty_ = self.labels_[keep], self.novelty_[keep]
        self.scored_by_ = self.scored_by_[keep]
        return self._refit()

    def load_state_dict(self, tensors, metadata, *, source: str = "the state") -> Calibration:
        super().load_state_dict(tensors, metadata, source=source)
        if "scored_by_" not in self.__dict__ and "labels_" in self.__dict__:
            # saved before records kept their head: any head may have held any class
            self.scored_by_ = torch.full_like(self.labels_, torch.iinfo(torch.int64).max)
        if "method_" not in self.__dict__ and "labels_" in self.__dict__:
            self.method_ = DISTANCE_DEFAULT  # every head's default before others existed
        if isinstance(self.__dict__.get("novelty_"), torch.Tensor):
            self._check_novelty(source)
        return self

    def _check_novelty(self, source: str) -> None:
        """Refuse records whose novelty score is NaN or inf: a threshold taken from them
        would compare as "not below" with every score, calling every input known."""
        if not all_finite(self.novelty_.to(torch.float64)):
            raise ValueError(f"{source}: the novelty score of record "
                             f"{first_nonfinite(self.novelty_)} is NaN or inf")

    @property
    def n_records(self) -> int:
        return int(self.labels_.numel())

    @property
    def n_record_classes(self) -> int:
        """How many classes the records come from."""
        return int(self.labels_.unique().numel())


# ---------------------------------------------------------------------- records of a task
def calibration_folds(labels: torch.Tensor, share: float, seed: int) -> torch.Tensor:
    """The calibration fold of each of ``labels`` ``(n,)``, ``-1`` for none: each class's samples
    are shuffled (with ``seed``) and dealt in turn over ``K = max(2, round(1 / share))`` folds,
    so every fold holds about a ``share`` of each class; a class takes part only if its largest
    fold leaves it two samples (three samples at least)."""
    check_fraction(share, "share")
    labels = torch.as_tensor(labels, dtype=torch.int64).reshape(-1)
    k = max(2, round(1.0 / share))
    g = torch.Generator().manual_seed(int(seed))
    folds = torch.full_like(labels, -1)
    for c in labels.unique().tolist():
        members = torch.nonzero(labels == c)[:, 0]
        if len(members) - math.ceil(len(members) / k) < 2:
            continue
        start = int(torch.randint(k, (1,), generator=g))  # spreads the larger folds
        shuffled = members[torch.randperm(len(members), generator=g)]
        folds[shuffled] = (torch.arange(len(members)) + start) % k
    return folds


def without_samples(stats, X: torch.Tensor, y: torch.Tensor):
    """A copy of dense statistics ``stats`` without the samples ``X``, ``y`` they include (the
    exact inverse of :meth:`~gdacil.ClassGaussians.update`, by Chan's merge formula solved for
    one part). Every class must keep at least one sample; the classes of ``y`` move to the end
    of the class order."""
    from .stats import ClassGaussians
    from .stats.linalg import symmetrize

    if not isinstance(stats, ClassGaussians):
        raise ValueError(f"held-out calibration needs dense statistics (ClassGaussians) to take "
                         f"samples out exactly; got {type(stats).__name__}")
    part = ClassGaussians(stats.dim, ddof=stats.ddof, device=stats.device).update(X, y)
    labels = part.classes
    pos = stats.positions(labels).to(stats.device)
    n, m = stats.counts[pos].to(torch.float64), part.counts.to(torch.float64)
    left = n - m
    if bool((left < 1).any()):
        raise ValueError("held-out calibration must leave every class at least one sample")
    mean_h = part.means
    mean_r = (n[:, None] * stats.means[pos] - m[:, None] * mean_h) / left[:, None]
    gap = mean_r - mean_h
    scatter = (stats.scatters[pos] - part.scatters
               - (left * m / n)[:, None, None] * gap[:, :, None] * gap[:, None, :])
    denom = (left - stats.ddof).clamp_min(1.0)
    covs = torch.where((left > stats.ddof)[:, None, None],
                       symmetrize(scatter) / denom[:, None, None], torch.zeros_like(scatter))
    return stats.copy().remove_classes(labels).add_classes(labels, mean_r, covs, left)


def new_input_calibration(head, X: torch.Tensor, y: torch.Tensor, *,
                          method: str | None = None) -> Calibration:
    """:class:`Calibration` from samples ``X``, ``y`` that ``head`` did not learn, each scored
    by it as a new input (novelty ``method``, default the head's): split conformal in its
    textbook form."""
    method = head.default_novelty if method is None else method
    y = torch.as_tensor(y, dtype=torch.int64).reshape(-1)
    return Calibration().fit(head.score_samples(X, method).to(torch.float64).cpu(), y,
                             head.decision_function(X).to(torch.float64).cpu(),
                             torch.as_tensor(head.classes_.tolist(), dtype=torch.int64),
                             method=method)


def held_out_calibration(head, stats, X: torch.Tensor, y: torch.Tensor, *,
                         folds: torch.Tensor | None = None, method: str | None = None,
                         previous: Calibration | None = None,
                         min_records: int = MIN_RECORDS) -> Calibration:
    """:class:`Calibration` from samples ``X``, ``y`` of the current task that ``stats``
    include: each fold of them is scored (novelty ``method``, default the head's; class scores
    in ``head.classes_`` order) by a copy of ``head`` refitted on ``stats`` without that fold.
    ``folds`` ``(n,)`` numbers the folds (:func:`calibration_folds`; ``-1``: not a record);
    by default all of ``X`` is one fold. With fewer than ``min_records`` records, the newest of
    ``previous`` join them up to that many (:meth:`Calibration.fit`).

    Cross-fitting (several folds) makes every sample a record, each scored by a head that
    learned all but a fold of its class, so the records resemble new inputs more closely the
    more folds there are (one refit per fold). The copy refits every class, not only the
    task's: the shared terms (LR-RGDA's base ``B``, LDA's covariance) hold the held-out
    samples too, and in high dimensions with few samples per class they alone make the
    samples look familiar (openclipart's 1280-d features: 89% of held-out samples classified
    right with the task's classes refitted alone, 45% with the whole head refitted, as on new
    inputs). LR-RGDA decomposes only the task's classes again.
    """
    import copy

    X = torch.as_tensor(X)
    y = torch.as_tensor(y, dtype=torch.int64).reshape(-1)
    folds = (torch.zeros_like(y) if folds is None
             else torch.as_tensor(folds, dtype=torch.int64).reshape(-1))
    if folds.shape != y.shape:
        raise ValueError(f"folds: expected one fold per sample ({len(y)}); got {len(folds)}")
    order = torch.as_tensor(head.classes_.tolist(), dtype=torch.int64)
    novelty: list[torch.Tensor] = []
    best: list[tuple[torch.Tensor, torch.Tensor]] = []
    kept: list[torch.Tensor] = []
    for fold in folds[folds >= 0].unique().tolist():
        part = torch.nonzero(folds == fold)[:, 0]
        probe = copy.deepcopy(head).fit(without_samples(stats, X[part], y[part]))
        column = {c: j for j, c in enumerate(probe.classes_.tolist())}
        # without_samples moved the fold's classes to the end: back to the head's order
        at = torch.tensor([column[c] for c in order.tolist()], dtype=torch.int64)
        novelty.append(probe.score_samples(X[part], method).to(torch.float64).cpu())
        full = probe.decision_function(X[part]).to(torch.float64).cpu()[:, at]
        best.append(best_scores(full, order.expand(len(part), -1), y[part]))
        kept.append(part)
    if not kept:
        raise ValueError("calibration needs at least one held-out record")
    rows = torch.cat(kept)
    where = rows.argsort()  # the records in the order of X
    return Calibration().fit(torch.cat(novelty)[where], y[rows][where],
                             torch.cat([s for s, _ in best])[where],
                             torch.cat([c for _, c in best])[where],
                             previous=previous if len(rows) < min_records else None,
                             max_records=min_records,
                             method=head.default_novelty if method is None else method)
