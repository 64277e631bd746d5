"""The checks every head passes, for the tests of a new head: subclass :class:`HeadContract`.

:class:`HeadContract` is the test mixin all of gdacil's heads (NCM, LDA, QDA, RGDA, LR-RGDA, the
SGD head, FeCAM) pass, made public the way linear_operator ships ``LinearOperatorTestCase``:
whoever adds a head (a subclass of :class:`~gdacil.heads.base.GaussianHead`) checks it with one
subclass. The subclass says how to build the head (``make_head(**kw)``, passing on the keyword
arguments every head takes: ``priors``, ``dtype`` and ``class_batch_size``) and gives a dense
reference of its scores, computed independently (``reference(stats, X)``; :func:`gaussian_scores`
is the Gaussian log-posterior most heads are a form of). Each ``test_*`` method is then one
check; pytest collects them from a subclass named ``Test...``, and :meth:`HeadContract.check`
runs them all without pytest. The checks:

- scores: the head's scores equal the reference up to a per-sample constant (exactly, with
  ``exact_scores``); ``predict`` and ``predict_proba`` follow the reference; blocks of classes
  (``class_batch_size``) change no score; float32 inference stays close to float64; scores stay
  finite on degenerate statistics (a one-sample class, classes with fewer samples than
  dimensions); priors shift the scores by their logarithms;
- errors: predicting before ``fit``, the wrong dimension, NaN, an empty batch and statistics
  without classes are refused with clear errors; ``memory_report`` adds up;
- state: ``state_dict`` loaded into a head built from ``get_params()`` scores and predicts bit
  for bit as the head, and so does one written by ``save`` and read by ``GaussianHead.load``;
  such a head refits as the original does; every public fitted attribute (``name_``) is in the
  state (unless ``state_is_nested``);
- parameters: ``get_params``/``set_params`` round trip, a head built from them fits identically,
  an unknown name is a ``ValueError``, and the ``repr`` names the class;
- statistics: ``fit`` returns the head and leaves the statistics it reads exactly as they were;
  a head refitted after the statistics gained, changed or lost a class scores as a fresh head
  (no stale cache);
- ``top_k`` (where the head has one): its labels are the dense scores' top ``k`` for ``k = 1,
  2, 3`` (ties aside), also with the options in ``top_k_options``;
- novelty: every distance score of ``score_samples`` equals its dense reference
  (:func:`novelty_reference`), and so does ``"relative_likelihood"`` on heads whose scores are
  class log-densities (``densities``; the others refuse it), the default is the head's
  ``default_novelty`` (:data:`gdacil.novelty.DEFAULT_SCORE` or ``DISTANCE_DEFAULT``), ``"msp"``
  and ``"energy"`` follow the class scores, and the scores are the same after a ``merge`` of the
  statistics and after a state round trip.

The data helpers the checks use (:func:`make_stats`, :func:`queries`, :func:`gaussian_scores`,
:func:`novelty_reference`, :func:`uniform_log_priors`, :func:`centred`) are public too. Nothing here needs pytest.

Examples
--------
NCM's scores are the Gaussian log-posterior under identity covariances, exactly:

>>> import torch
>>> from gdacil.heads import NCM
>>> from gdacil.testing import HeadContract, gaussian_scores, uniform_log_priors
>>> class TestNCM(HeadContract):
...     exact_scores = True
...     densities = True  # its scores are class log-densities: "relative_likelihood" is checked
...
...     def make_head(self, **kw):
...         return NCM(**kw)
...
...     def mixture_covariance(self, stats):
...         return torch.eye(stats.dim, dtype=torch.float64)
...
...     def reference(self, stats, X):
...         eye = torch.eye(stats.dim, dtype=torch.float64).expand(stats.n_classes, -1, -1)
...         return gaussian_scores(X, stats.means, eye, uniform_log_priors(stats))
>>> checks = TestNCM().check()  # in a test file, pytest runs each as a test
>>> checks[0], checks[-1]
('test_scores_match_dense_reference', 'test_novelty_scores_are_exact_under_merge_and_state')
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from .errors import NotFittedError
from .heads.base import GaussianHead
from .state import json_params
from .stats import ClassGaussians, ClassStatistics
from .stats.linalg import NumericalWarning

__all__ = ["HeadContract", "at_typical_norm", "centred", "gaussian_scores", "make_stats",
           "novelty_reference", "queries", "uniform_log_priors"]


# ---------------------------------------------------------------------- data
def make_stats(seed: int = 0, d: int = 10, n_classes: int = 6, few_shot: tuple[int, ...] = (0,),
               ddof: int = 0) -> tuple[ClassGaussians, torch.Tensor, torch.Tensor]:
    """Statistics of anisotropic Gaussian classes, and the samples they were built from.

    Class ``c`` (label ``10 c + 3``: labels need not be ``0..C-1``) has ``5 d`` samples, or
    ``d // 2`` (fewer than dimensions, a singular covariance) when ``c`` is in ``few_shot``.

    Parameters
    ----------
    seed : int, default 0
    d : int, default 10
        Feature dimension.
    n_classes : int, default 6
    few_shot : tuple of int, default (0,)
        Positions of the classes with fewer samples than dimensions.
    ddof : {0, 1}, default 0
        The statistics' covariance normalisation.

    Returns
    -------
    stats : ClassGaussians
    X : float64 tensor ``(n, d)``
    y : int64 tensor ``(n,)``

    Examples
    --------
    >>> stats, X, y = make_stats()
    >>> stats.classes, stats.dim, X.shape
    ([3, 13, 23, 33, 43, 53], 10, torch.Size([255, 10]))
    """
    g = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for c in range(n_classes):
        n = d // 2 if c in few_shot else 5 * d
        mix = torch.randn(d, d, generator=g, dtype=torch.float64) * (0.2 + 0.15 * c)
        xs.append(torch.randn(n, d, generator=g, dtype=torch.float64) @ mix
                  + 1.5 * torch.randn(d, generator=g, dtype=torch.float64))
        ys.append(torch.full((n,), 10 * c + 3))
    X, y = torch.cat(xs), torch.cat(ys)
    return ClassGaussians(d, ddof=ddof).update(X, y), X, y


def queries(d: int, n: int = 40, seed: int = 1) -> torch.Tensor:
    """``n`` float64 query points of dimension ``d``, spread wider than :func:`make_stats`'s
    classes (``2 N(0, I)``), so that every class wins some and the scores vary widely.

    Examples
    --------
    >>> queries(10).shape
    torch.Size([40, 10])
    """
    g = torch.Generator().manual_seed(seed)
    return 2.0 * torch.randn(n, d, generator=g, dtype=torch.float64)


def gaussian_scores(X: torch.Tensor, means: torch.Tensor, covs: torch.Tensor,
                    log_priors: torch.Tensor) -> torch.Tensor:
    """The dense reference: ``log N(x; mu_c, Sigma_c) + log pi_c``, up to the ``-d/2 log 2 pi``
    every class shares, with ``torch.linalg.solve`` and ``logdet`` class by class.

    Parameters
    ----------
    X : tensor ``(n, d)``
    means : tensor ``(C, d)``
    covs : tensor ``(C, d, d)``
        Positive definite (a shared covariance: ``cov.expand(C, d, d)``).
    log_priors : tensor ``(C,)``

    Returns
    -------
    tensor ``(n, C)``

    Examples
    --------
    >>> import torch
    >>> X, mu = torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)
    >>> eye = torch.eye(2, dtype=torch.float64)[None]
    >>> gaussian_scores(X, mu, eye, torch.zeros(1, dtype=torch.float64))
    tensor([[-1.]], dtype=torch.float64)
    """
    out = []
    for mu, S, lp in zip(means, covs, log_priors):
        dx = X - mu
        out.append(-0.5 * (dx * torch.linalg.solve(S, dx.T).T).sum(1)
                   - 0.5 * torch.logdet(S) + lp)
    return torch.stack(out, 1)


def novelty_reference(stats: ClassStatistics, X: torch.Tensor, method: str,
                      class_densities: torch.Tensor | None = None,
                      mixture_covariance: torch.Tensor | None = None) -> torch.Tensor:
    """The dense reference of a distance score of :mod:`gdacil.novelty`: every covariance
    formed and solved explicitly, class by class, in float64; gdacil's own scores at
    :func:`at_typical_norm` of ``X``. ``"relative_likelihood"`` also needs the head's
    ``log N(x; mu_c, Sigma_c) + log pi_c`` ``(n, C)`` of those inputs as ``class_densities``
    (:func:`gaussian_scores` of its covariances) and the mean ``(d, d)`` of its class
    covariances as ``mixture_covariance``.

    Examples
    --------
    >>> stats, X, _ = make_stats()
    >>> novelty_reference(stats, X[:2], "mahalanobis").shape
    torch.Size([2])
    """
    from .novelty import BACKGROUND_WEIGHT, BASE_ALPHAS, TYPICAL_NORM_SCORES

    X = at_typical_norm(stats, X) if method in TYPICAL_NORM_SCORES else X.to(torch.float64)
    mu, counts = stats.means.to(torch.float64), stats.counts.to(torch.float64)
    covs = stats.covariances().to(torch.float64)
    n_classes, d = mu.shape
    w = counts / counts.sum()
    center = (w[:, None] * mu).sum(0)
    if method == "cosine":
        unit = torch.nn.functional.normalize
        return torch.stack([unit(X - center, dim=1) @ unit(m - center, dim=0) for m in mu], 1).amax(1)
    avg = covs.mean(0)
    unit_scale = float(avg.trace()) / max(float(counts.sum()) - n_classes, 1.0)
    shared = BASE_ALPHAS[0] * avg + BASE_ALPHAS[1] * unit_scale * torch.eye(d, dtype=torch.float64)
    between = sum(wc * torch.outer(m - center, m - center) for wc, m in zip(w, mu))

    def distance(S, m):
        dx = X - m
        return (dx * torch.linalg.solve(S, dx.T).T).sum(1)

    nearest = torch.stack([distance(shared, m) for m in mu], 1).amin(1)
    if method == "mahalanobis":
        return -nearest
    if method == "relative_likelihood":
        assert class_densities is not None and mixture_covariance is not None, \
            "relative_likelihood needs the class densities and their mean covariance"
        head = class_densities.to(torch.float64).logsumexp(1) + 0.5 * torch.logdet(shared)
        near = -0.5 * nearest
        # each model against the Gaussian of its mixture's mean and covariance, in S's units
        near_background = distance(shared + between, center)
        head_background = distance(mixture_covariance.to(torch.float64) + between, center)
        return 0.5 * (near + 0.5 * BACKGROUND_WEIGHT * near_background
                      + head + 0.5 * BACKGROUND_WEIGHT * head_background)
    weight = {"relative_mahalanobis": 1.0, "shrunk_relative_mahalanobis": BACKGROUND_WEIGHT}[method]
    return weight * distance(shared + between, center) - nearest


def at_typical_norm(stats: ClassStatistics, X: torch.Tensor) -> torch.Tensor:
    """``X`` (float64) as gdacil's own novelty scores see it: each row rescaled towards the root
    mean square norm of the data of ``stats`` (the classes' mean covariance for their spread)
    by :func:`gdacil.novelty.to_typical_norm`.

    Examples
    --------
    >>> stats, X, _ = make_stats()
    >>> Q = at_typical_norm(stats, X[:3])
    >>> bool(torch.allclose(Q.norm(dim=1), at_typical_norm(stats, 1.5 * X[:3]).norm(dim=1)))
    True
    """
    from .novelty import to_typical_norm

    mu, counts = stats.means.to(torch.float64), stats.counts.to(torch.float64)
    mean_square = ((counts / counts.sum()) * mu.square().sum(1)).sum() \
        + stats.covariances().to(torch.float64).mean(0).trace()
    return to_typical_norm(X.to(torch.float64), mean_square.sqrt())


def uniform_log_priors(stats: ClassStatistics) -> torch.Tensor:
    """``log(1 / C)`` for each of the ``C`` classes of ``stats`` (the heads' default priors).

    Examples
    --------
    >>> uniform_log_priors(make_stats(n_classes=2)[0]).exp()
    tensor([0.5000, 0.5000], dtype=torch.float64)
    """
    return torch.full((stats.n_classes,), -math.log(stats.n_classes), dtype=torch.float64)


def centred(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` less their mean over classes, sample by sample: scores that differ by a
    per-sample constant (which changes neither ``argmax`` nor the softmax) become equal.

    Examples
    --------
    >>> import torch
    >>> centred(torch.tensor([[1.0, 3.0], [10.0, 12.0]]))
    tensor([[-1.,  1.],
            [-1.,  1.]])
    """
    return scores - scores.mean(1, keepdim=True)


# ---------------------------------------------------------------------- helpers
@contextlib.contextmanager
def _raises(kind: type[BaseException], match: str) -> Iterator[None]:
    """Like ``pytest.raises(kind, match=match)``, without pytest."""
    try:
        yield
    except kind as exc:
        if not re.search(match, str(exc)):
            raise AssertionError(f"{kind.__name__} raised, but its message {str(exc)!r} does "
                                 f"not match {match!r}") from exc
    else:
        raise AssertionError(f"no {kind.__name__} raised (expected one matching {match!r})")


def _snapshot(stats: ClassStatistics) -> dict[str, Any]:
    """Everything ``stats`` hold, copied: its state, classes, revisions and moments."""
    tensors, metadata = stats.state_dict()
    return {"tensors": {k: t.clone() for k, t in tensors.items()},
            "metadata": json_params(metadata),
            "classes": stats.classes,
            "revisions": [stats.revision(c) for c in stats.classes],
            "counts": stats.counts.clone(), "means": stats.means.clone(),
            "covariances": stats.covariances().clone()}


def _changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The names of the entries of two :func:`_snapshot` that are not exactly equal."""
    changed = []
    for key, value in before.items():
        other = after[key]
        if isinstance(value, torch.Tensor):
            same = torch.equal(value, other)
        elif key == "tensors":
            same = value.keys() == other.keys() and all(torch.equal(value[k], other[k])
                                                        for k in value)
        else:
            same = value == other
        if not same:
            changed.append(key)
    return changed


def _fresh_labels(stats: ClassStatistics, k: int) -> list[int]:
    """``k`` labels ``stats`` do not hold."""
    start = max(stats.classes) + 1 if stats.n_classes else 0
    return list(range(start, start + k))


# ---------------------------------------------------------------------- the contract
class HeadContract:
    """Checks every head must pass: a subclass gives ``make_head`` and ``reference``.

    Subclass it in a test file under a name starting with ``Test`` (pytest then runs every
    ``test_*`` method as a test), or call :meth:`check`. See :mod:`gdacil.testing` for what
    each check tests.

    Attributes
    ----------
    exact_scores : bool, default False
        True when ``decision_function`` equals ``reference`` itself, not only up to a
        per-sample constant.
    tol : float, default 1e-9
        Largest difference of scores allowed, relative to the largest reference score.
    state_is_nested : bool, default False
        True for a head whose ``state_dict`` nests the states of its parts instead of declaring
        its fitted attributes (FeCAM stores its statistics and rebuilds its rows from them): the
        completeness check of the declared state is then skipped; the round trips still run.
    top_k_options : mapping, default {}
        Keyword arguments of a second pass of the ``top_k`` check (``{"pruned": True}`` for
        LR-RGDA: its pruned search, which it uses only from 1000 classes on by default).
    densities : bool, default False
        True when ``reference`` is the class log-densities ``log N(x; mu_c, Sigma_c) + log pi_c``
        themselves and the head offers ``"relative_likelihood"``, checked against
        :func:`novelty_reference` of them and of ``mixture_covariance(stats)``; False: the head
        must refuse that score.
    """

    exact_scores: ClassVar[bool] = False
    tol: ClassVar[float] = 1e-9
    state_is_nested: ClassVar[bool] = False
    top_k_options: ClassVar[Mapping[str, Any]] = {}
    densities: ClassVar[bool] = False

    def make_head(self, **kw: Any) -> GaussianHead:
        """A new, unfitted head; ``kw`` (``priors``, ``dtype``, ``class_batch_size``) must reach
        the constructor."""
        raise NotImplementedError(f"{type(self).__name__} must define make_head(self, **kw)")  # intended: the subclass gives it

    def reference(self, stats: ClassStatistics, X: torch.Tensor) -> torch.Tensor:
        """The scores ``(n, C)`` the head should give ``X`` once fitted on ``stats``, computed
        independently of the head (:func:`gaussian_scores` for a Gaussian head)."""
        raise NotImplementedError(f"{type(self).__name__} must define reference(self, stats, X)")  # intended: the subclass gives it

    def mixture_covariance(self, stats: ClassStatistics) -> torch.Tensor:
        """With ``densities``: the mean ``(d, d)`` of the class covariances whose mixture the
        head's ``"relative_likelihood"`` compares with its class-agnostic Gaussian."""
        raise NotImplementedError(f"{type(self).__name__} must define mixture_covariance")  # intended: the subclass gives it

    def check(self) -> list[str]:
        """Run every check (each ``test_*`` method, in the order they are defined) and return
        their names; the first that fails raises an ``AssertionError`` naming it."""
        names: list[str] = []
        for cls in reversed(type(self).__mro__):
            names.extend(name for name, value in vars(cls).items()
                         if name.startswith("test_") and callable(value) and name not in names)
        for name in names:
            try:
                getattr(self, name)()
            except Exception as exc:
                raise AssertionError(f"{type(self).__name__}.{name} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
        return names

    def _close(self, got: torch.Tensor, expected: torch.Tensor) -> bool:
        scale = float(expected.abs().max())
        return float((got.double() - expected.double()).abs().max()) <= self.tol * scale

    # ------------------------------------------------------------------ scores
    def test_scores_match_dense_reference(self) -> None:
        stats, _, _ = make_stats()
        X = queries(stats.dim)
        got = self.make_head().fit(stats).decision_function(X)
        ref = self.reference(stats, X)
        assert got.shape == ref.shape, f"scores of shape {tuple(got.shape)}, not {tuple(ref.shape)}"
        assert self._close(centred(got), centred(ref)), "the scores differ from the reference"
        if self.exact_scores:
            assert self._close(got, ref), "the scores differ from the reference by a constant"

    def test_predict_and_proba_follow_the_reference(self) -> None:
        stats, _, _ = make_stats()
        X = queries(stats.dim)
        head = self.make_head().fit(stats)
        ref = self.reference(stats, X)
        assert head.classes_.tolist() == stats.classes, "classes_ are not the statistics' classes"
        assert torch.equal(head.predict(X), head.classes_[ref.argmax(1)]), \
            "predict is not the reference's argmax"
        proba = head.predict_proba(X)
        assert torch.allclose(proba, torch.softmax(ref, 1), atol=1e-9), \
            "predict_proba is not the reference's softmax"
        assert torch.allclose(proba.sum(1), torch.ones(len(X), dtype=torch.float64))

    def test_class_batching_does_not_change_scores(self) -> None:
        stats, _, _ = make_stats()
        X = queries(stats.dim)
        a = self.make_head(class_batch_size=1).fit(stats).decision_function(X)
        b = self.make_head(class_batch_size=1000).fit(stats).decision_function(X)
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-10), "blocks of classes change the scores"

    def test_float32_inference_is_close(self) -> None:
        stats, _, _ = make_stats()
        X = queries(stats.dim)
        a = self.make_head(dtype=torch.float32).fit(stats)
        b = self.make_head().fit(stats)
        assert a.decision_function(X).dtype == torch.float32, "dtype=float32 does not score in it"
        assert torch.allclose(a.predict_proba(X).double(), b.predict_proba(X), atol=1e-3), \
            "float32 probabilities are far from float64's"

    def test_scores_are_finite_even_with_degenerate_statistics(self) -> None:
        # one class is a single sample (zero covariance), another has n < d
        stats, _, _ = make_stats(few_shot=(1,))
        stats.update(torch.ones(1, stats.dim), [999])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NumericalWarning)
            head = self.make_head().fit(stats)
        assert torch.isfinite(head.decision_function(queries(stats.dim))).all(), \
            "scores are not finite with degenerate statistics"

    def test_priors_shift_scores_by_log_prior(self) -> None:
        stats, _, _ = make_stats()
        X = queries(stats.dim)
        p = np.arange(1, stats.n_classes + 1, dtype=float)
        with warnings.catch_warnings():  # renormalised, with a warning
            warnings.filterwarnings("ignore", "The priors do not sum to 1", UserWarning)
            a = self.make_head(priors=p).fit(stats).decision_function(X)
        b = self.make_head().fit(stats).decision_function(X)
        shift = torch.as_tensor(np.log(p / p.sum()) + math.log(stats.n_classes))
        assert torch.allclose(a - b, shift.expand_as(a), atol=1e-9), \
            "priors do not shift the scores by log(C pi_c)"

    # ------------------------------------------------------------------ errors
    def test_bad_input_errors(self) -> None:
        stats, _, _ = make_stats()
        head = self.make_head()
        with _raises(NotFittedError, "not fitted"):
            head.predict(queries(stats.dim))
        head.fit(stats)
        with _raises(ValueError, "dimension 3, expected"):
            head.predict(torch.zeros(2, 3))
        with _raises(ValueError, "NaN or inf"):
            head.decision_function(torch.full((2, stats.dim), float("nan")))
        with _raises(ValueError, "empty batch"):
            head.predict(torch.zeros(0, stats.dim))
        with _raises(ValueError, "no classes"):
            self.make_head().fit(ClassGaussians(stats.dim))

    def test_memory_report(self) -> None:
        stats, _, _ = make_stats()
        report = self.make_head().fit(stats).memory_report()
        assert report["total"] >= report["rows"] > 0, f"memory_report {report}"

    # ------------------------------------------------------------------ state
    def test_state_round_trip_is_bit_identical(self) -> None:
        stats, _, _ = make_stats()
        X = queries(stats.dim)
        head = self.make_head().fit(stats)
        scores, labels = head.decision_function(X), head.predict(X)
        fresh = type(head)(**head.get_params())
        loaded = fresh.load_state_dict(*head.state_dict())
        assert loaded is fresh, "load_state_dict must return the head"
        assert torch.equal(loaded.classes_, head.classes_), "the loaded head's classes_ differ"
        assert torch.equal(loaded.decision_function(X), scores), "the loaded head scores otherwise"
        assert torch.equal(loaded.predict(X), labels), "the loaded head predicts otherwise"
        self._same_top_k(loaded, head, X)

    def test_saved_head_loads_bit_identical_and_refits_alike(self) -> None:
        stats, _, _ = make_stats()
        X = queries(stats.dim)
        head = self.make_head().fit(stats)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "head.safetensors")
            head.save(path)
            loaded = GaussianHead.load(path)
            again = GaussianHead.load(path)
        assert type(loaded) is type(head), f"GaussianHead.load gave a {type(loaded).__name__}"
        assert torch.equal(loaded.decision_function(X), head.decision_function(X)), \
            "the head read by GaussianHead.load scores otherwise"
        assert torch.equal(loaded.predict(X), head.predict(X)), \
            "the head read by GaussianHead.load predicts otherwise"
        self._same_top_k(loaded, head, X)
        # what a loaded head keeps of its caches, bound to the statistics, refits as the head
        refit = again.bind(stats).fit(stats).decision_function(X)
        assert torch.equal(refit, head.fit(stats).decision_function(X)), \
            "a loaded head refits otherwise than the head it was saved from"

    def test_declared_state_is_complete(self) -> None:
        stats, _, _ = make_stats()
        head = self.make_head().fit(stats)
        tensors, metadata = head.state_dict()
        assert metadata.get("class") == type(head).__name__, "the state does not name the class"
        if self.state_is_nested:
            return
        stored = set(tensors) | set(metadata.get("attributes", {}))
        fitted = [name for name in vars(head) if name.endswith("_") and not name.startswith("_")]
        missing = sorted(set(fitted) - stored)
        assert not missing, (f"{type(head).__name__} sets fitted attributes {missing} that its "
                             "state lacks: add them to _state_attributes")

    # ------------------------------------------------------------------ parameters
    def test_params_round_trip_and_repr(self) -> None:
        stats, _, _ = make_stats()
        X = queries(stats.dim)
        head = self.make_head()
        params = head.get_params()
        clone = type(head)(**params)
        assert json_params(clone.get_params()) == json_params(params), \
            "a head built from get_params() has other parameters"
        assert head.set_params(**params) is head, "set_params must return the head"
        assert json_params(head.get_params()) == json_params(params), \
            "set_params(**get_params()) changed the parameters"
        with _raises(ValueError, "no_such_parameter"):
            head.set_params(no_such_parameter=1)
        assert json_params(head.get_params()) == json_params(params), \
            "a refused set_params changed the parameters"
        name = type(head).__name__
        assert repr(head).startswith(f"{name}("), f"the repr {head!r} does not name {name}"
        # the parameters are what fit reads: a clone fits alike, and set_params takes effect
        assert torch.equal(clone.fit(stats).decision_function(X),
                           head.fit(stats).decision_function(X)), \
            "a head built from get_params() scores otherwise"
        lowered = self.make_head().set_params(dtype="float32").fit(stats)
        assert lowered.decision_function(X).dtype == torch.float32, \
            "set_params(dtype='float32') did not reach fit"

    # ------------------------------------------------------------------ statistics
    def test_fit_returns_self_and_leaves_the_statistics_unchanged(self) -> None:
        stats, _, _ = make_stats()
        X = queries(stats.dim)
        before = _snapshot(stats)
        head = self.make_head()
        assert head.fit(stats) is head, "fit must return the head"
        head.decision_function(X)  # heads that build lazily build here
        head.predict(X)
        changed = _changes(before, _snapshot(stats))
        assert not changed, f"fitting changed the statistics' {changed}"

    def test_refit_after_the_statistics_changed_equals_a_fresh_fit(self) -> None:
        stats, _, _ = make_stats()
        X = queries(stats.dim)
        head = self.make_head().fit(stats)
        head.decision_function(X)  # caches built
        g = torch.Generator().manual_seed(5)
        d = stats.dim
        new = 1.0 + 0.8 * torch.randn(30, d, generator=g, dtype=torch.float64)
        edits = {
            "gained a class": lambda: stats.update(new, [_fresh_labels(stats, 1)[0]] * 30),
            "changed a class": lambda: stats.update(
                torch.randn(4, d, generator=g, dtype=torch.float64), [stats.classes[1]] * 4),
            "lost a class": lambda: stats.remove_classes([stats.classes[2]]),
        }
        for what, edit in edits.items():
            edit()
            refit = head.fit(stats)
            fresh = self.make_head().fit(stats)
            assert torch.equal(refit.classes_, fresh.classes_), f"after the statistics {what}"
            assert self._close(refit.decision_function(X), fresh.decision_function(X)), \
                f"refitted after the statistics {what}, the head scores as a fresh one does not"

    # ------------------------------------------------------------------ top-k
    def test_top_k_follows_the_dense_scores(self) -> None:
        stats, _, _ = make_stats()
        X = queries(stats.dim)
        head = self.make_head().fit(stats)
        if not callable(getattr(head, "top_k", None)):
            return
        dense = head.decision_function(X)
        position = {c: i for i, c in enumerate(head.classes_.tolist())}
        for options in [{}, dict(self.top_k_options)][: 2 if self.top_k_options else 1]:
            for k in (1, 2, 3):
                scores, labels = head.top_k(X, k, **options)[:2]
                assert labels.shape == scores.shape == (len(X), k), f"top_k(k={k}, {options})"
                where = torch.tensor([[position[c] for c in row] for row in labels.tolist()])
                best = dense.topk(k, dim=1).values
                # the dense scores of the labels found are the k best, in order: the labels are
                # the dense top k up to classes of equal scores
                assert self._close(dense.gather(1, where), best), \
                    f"top_k(k={k}, {options}) labels are not the dense top {k}"
                assert self._close(scores, best), f"top_k(k={k}, {options}) scores"

    # ------------------------------------------------------------------ novelty
    def test_novelty_scores_match_the_dense_reference(self) -> None:
        from .novelty import DEFAULT_SCORE, DISTANCE_DEFAULT, DISTANCE_SCORES, logit_score

        stats, _, _ = make_stats()
        X = queries(stats.dim)
        head = self.make_head().fit(stats)
        for method in DISTANCE_SCORES:
            got = head.score_samples(X, method)
            assert got.shape == (len(X),) and got.dtype == torch.float64, f"{method}: shape/dtype"
            assert self._close(got, novelty_reference(stats, X, method)), \
                f"score_samples({method!r}) differs from the dense reference"
        if self.densities:
            got = head.score_samples(X, "relative_likelihood")
            expected = novelty_reference(stats, X, "relative_likelihood",
                                         self.reference(stats, at_typical_norm(stats, X)),
                                         self.mixture_covariance(stats))
            assert self._close(got, expected), \
                "score_samples('relative_likelihood') differs from the dense reference"
        else:
            with _raises(ValueError, "offers no 'relative_likelihood'"):
                head.score_samples(X, "relative_likelihood")
        default = head.score_samples(X)
        assert head.default_novelty in (DEFAULT_SCORE if self.densities else DISTANCE_DEFAULT,
                                        DISTANCE_DEFAULT), head.default_novelty
        assert torch.equal(default, head.score_samples(X, head.default_novelty)), \
            "the default novelty score is not the head's default_novelty"
        for method in ("msp", "energy"):
            assert torch.equal(head.score_samples(X, method),
                               logit_score(head.decision_function(X), method)), method

    def test_novelty_scores_are_exact_under_merge_and_state(self) -> None:
        stats, X, y = make_stats()
        Q = queries(stats.dim)
        half = torch.arange(len(y)) % 2 == 0
        merged = ClassGaussians(stats.dim, ddof=stats.ddof).update(X[half], y[half])
        merged.merge(ClassGaussians(stats.dim, ddof=stats.ddof).update(X[~half], y[~half]))
        head = self.make_head().fit(stats)
        scores = head.score_samples(Q)
        assert self._close(self.make_head().fit(merged).score_samples(Q), scores), \
            "novelty scores of merged statistics differ from those of all samples at once"
        loaded = type(head)(**head.get_params()).load_state_dict(*head.state_dict())
        assert torch.equal(loaded.score_samples(Q), scores), "a loaded head's novelty differs"

    def _same_top_k(self, loaded: Any, head: Any, X: torch.Tensor) -> None:
        if not callable(getattr(head, "top_k", None)):
            return
        for options in ({}, dict(self.top_k_options)):
            a, b = loaded.top_k(X, 3, **options)[:2], head.top_k(X, 3, **options)[:2]
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), \
                f"the loaded head's top_k({options}) differs"
