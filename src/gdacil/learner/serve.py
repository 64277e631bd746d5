"""``gdacil serve``: a model directory behind an HTTP JSON API.

A :class:`ModelService` holds the current version of a model and answers from it; it does not
depend on a web framework. :func:`create_app` puts it behind a FastAPI application and
:func:`serve` runs that with uvicorn (``pip install 'gdacil[serve]'``).

Endpoints (JSON in and out; every error is ``{"error": "<what is wrong>"}`` with its status):

=================  ================================================================================
``GET /health``    ``{"status": "ok", "version": "v3", "classes": 40}``
``GET /info``      what ``gdacil info --format json`` prints, plus the server's limits
``POST /predict``  ``{"inputs": [...], "top_k": 1}``: texts for a text model; base64-encoded image
                   files (or ``data:`` URLs) for an image model; lists of numbers for a vectors
                   model. Answers ``{"version": "v3",
                   "predictions": [[{"class", "score", "probability"}, ...], ...]}``, one list per
                   input, best class first. Optional, on a calibrated model: ``"reject": true``
                   (and ``"reject_rate"``) adds ``"unknown"`` and ``"novelty"`` (one per input)
                   and ``"threshold"``; ``"sets": alpha`` adds ``"sets"``, each input's
                   conformal set of classes
``POST /learn``    only with ``allow_learn``: ``{"inputs": [...], "labels": [...]}``. Learns on a
                   copy of the model, saves the copy as a new version, then makes it the one that
                   answers: ``{"version": "v4", "new": [...], "updated": [...], "classes": 41,
                   "report": "..."}``
``GET /versions``  ``{"serving": "v3", "versions": [...]}`` (``gdacil versions --format json``)
``POST /rollback`` ``{"version": "v2"}``: that version is made current and answers
``GET /inbox``     with an inbox (:mod:`gdacil.learner.inbox`): its items, oldest first;
                   ``POST /inbox/{id}/label`` ``{"label": ...}``, ``POST /inbox/{id}/discard``
                   and ``POST /inbox/learn`` (every labelled item in one learn, once) act on them
``GET /metrics``   the Prometheus text format (:mod:`gdacil.learner.metrics`)
``GET /``          the console: a page over these endpoints (``gdacil/learner/console/``)
=================  ================================================================================

What changes state (learn, rollback, the inbox's label, discard and learn) needs the grant of
:mod:`gdacil.learner.access`: the bearer token when the server has one (which the inbox and the
versions need too), else ``allow_learn``.

Statuses: 400 bad input (a body that is not a JSON object, wrong types, bad base64, an
unreadable image, a label that is not a class name, too many inputs or pixels, a
``reject_rate`` below :data:`MIN_REJECT_RATE`) or a ``Host`` the server does not answer to, 401
a request without the server's token (``WWW-Authenticate: Bearer``), 403 a change when none is
allowed, and any POST from a browser page of another origin, 404/405 an unknown path, version
or inbox item, or method, 409 when another process changed the model while a learn ran
(nothing is written), 413 a body over ``max_body`` bytes, 415 a POST body not sent as
``application/json``, 500 a failure of the server itself (the log has the traceback), 503 (with
``Retry-After``) when the queue is full, a request missed its deadline (``timeout``), a learn
could not be saved (a read-only or full disk: the message names the file), or the server is
shutting down. :mod:`gdacil.learner.guards` says why the host, origin and content type are
checked.

Scoring never runs on the event loop: one worker thread runs every backbone forward through a
:class:`~gdacil.learner.scheduler.PredictionScheduler`, which batches concurrent requests (up to
``max_batch`` inputs and about ``batch_seconds`` of work per forward), smallest request first, so
one client's huge or numerous inputs cannot hold up another's small request for more than about
two forwards. Bodies are parsed and images decoded in the thread pool, at most ``max_decoding``
images at once; texts are cut to the backbone's bound before tokenising.

Predictions keep flowing while a learn runs: every request is answered by the model that was
current when it was queued, and the learned copy replaces it with one reference assignment,
after its version is saved. Versions written by other processes (``gdacil learn``, ``gdacil
rollback``) are loaded and swapped in within ``poll`` seconds; a version that fails to load keeps
the old one serving, and ``GET /health`` answers 503 with ``"status": "stale"`` and the reason
until a loadable version is current again.
"""

import asyncio
import base64
import binascii
import gc
import json
import logging
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from .._optional import require
from .._validation import check_fraction
from . import guards
from .access import CHALLENGE, Access
from .guards import BodyLimit, RequestGuard
from .metrics import RequestMetrics, ServerMetrics
from .scheduler import Busy, Expired, PredictionScheduler

__all__ = ["ModelService", "RequestError", "create_app", "serve"]

INSTALL = "pip install 'gdacil[serve]'"
_log = logging.getLogger(__name__)
#: Seconds before a version that failed to load is tried again (a new CURRENT is tried at once).
RETRY_FAILED_LOAD = 30.0
#: The smallest ``reject_rate`` a request may ask: a rate below one in a million needs over a
#: million calibration records
MIN_REJECT_RATE = 1e-6
#: The most commas, brackets and braces a request body may hold (texts included). Parsing
#: holds the Python interpreter, and its time grows with the JSON values of a body, not its
#: bytes: this bounds it to about 0.1 s (2**18 nested lists), far above what 256 texts or images
#: need
MAX_JSON_SEPARATORS = 1 << 18


class RequestError(ValueError):
    """A request the service refuses; ``status`` is its HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status

    @property
    def headers(self) -> dict | None:
        """The headers its answer needs: ``Retry-After`` for 503, the challenge for 401."""
        return {503: {"Retry-After": "1"}, 401: {"WWW-Authenticate": CHALLENGE}}.get(self.status)


@dataclass(frozen=True)
class PredictRequest:
    """A checked ``/predict`` body: decoded inputs, their costs, ``top_k``, and what it asks of
    a calibrated model: ``reject`` (with ``reject_rate``, None: the model's) and ``sets`` (the
    conformal sets' miscoverage, None: no sets)."""

    items: list
    costs: list[float]
    top_k: int
    reject: bool = False
    reject_rate: float | None = None
    sets: float | None = None
    sent: tuple = ()  # the inputs as the client sent them (what an inbox keeps)

    @property
    def options(self) -> dict:
        """The keyword arguments of :meth:`gdacil.learner.Learner.predict` beyond ``top_k``."""
        out: dict = {}
        if self.reject:
            out.update(reject=True, reject_rate=self.reject_rate)
        if self.sets is not None:
            out["sets"] = self.sets
        return out


class ModelService:
    """The current version of a model directory, answering predictions and (optionally) learns.

    Parameters
    ----------
    directory : path
        A model directory written by :meth:`gdacil.learner.Learner.save` (``gdacil learn``).
    allow_learn : bool
        Whether :meth:`learn` is allowed (``POST /learn``) without a token.
    max_batch : int
        Most inputs in one backbone forward.
    max_inputs : int
        Most inputs in one request.
    max_body : int
        Most bytes in one request body (checked by :func:`create_app`).
    max_pixels : int
        Most pixels in one image input (checked from its header, before it is decoded).
    max_pending : int
        Most inputs waiting to be scored; a request that would exceed it gets 503 at once.
    timeout : float
        Seconds within which a predict request is answered, or refused with 503 (its deadline).
    batch_seconds : float
        Target duration of one backbone forward: the bound on how long a request waits for the
        forward in flight (see :mod:`gdacil.learner.scheduler`).
    max_decoding : int
        Images decoded at once (bounds the memory that large images take while decoding).
    poll : float
        Seconds between checks for a version written by another process; 0 never checks.
    device : optional
        Device of the backbone (default: the backbone's own).
    token : str, optional
        The bearer token that changes to the model and the console's data need
        (:mod:`gdacil.learner.access`); with one, learning is allowed with it.
    inbox : Inbox, optional
        Where inputs answered unknown are kept (:class:`gdacil.learner.inbox.Inbox`); None:
        nothing is kept.
    precision : str, optional
        Precision of the backbone's forward passes, overriding the model's ``precision`` while
        it is served (versions learned over ``/learn`` keep the model's).

    Examples
    --------
    >>> import os, tempfile
    >>> from gdacil.learner import Learner
    >>> from gdacil.learner.serve import ModelService
    >>> tmp = tempfile.TemporaryDirectory()
    >>> pets = os.path.join(tmp.name, "pets")
    >>> learner = Learner("minilm")
    >>> _ = learner.learn(["a purring cat", "a barking dog"], ["cat", "dog"])
    >>> learner.save(pets)
    'v1'
    >>> with ModelService(pets) as service:
    ...     service.predict({"inputs": ["a kitten"], "top_k": 2})["predictions"][0][0]["class"]
    'cat'
    >>> tmp.cleanup()
    """

    def __init__(self, directory, *, allow_learn: bool = False, max_batch: int = 64,
                 max_inputs: int = 256, max_body: int = 32 << 20, max_pixels: int = 40_000_000,
                 max_pending: int = 1024, timeout: float = 60.0, batch_seconds: float = 0.3,
                 max_decoding: int = 4, poll: float = 1.0, device=None,
                 token: str | None = None, inbox=None, precision: str | None = None):
        for name, value in (("max_batch", max_batch), ("max_inputs", max_inputs),
                            ("max_body", max_body), ("max_pixels", max_pixels),
                            ("max_pending", max_pending), ("max_decoding", max_decoding)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        for name, seconds in (("timeout", timeout), ("batch_seconds", batch_seconds)):
            if not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds; got "
                                 f"{seconds!r}")
        if not isinstance(poll, (int, float)) or not 0 <= poll < float("inf"):
            raise ValueError(f"poll must be 0 or a positive number of seconds; got {poll!r}")
        if max_pending < max_inputs:
            raise ValueError(f"max_pending ({max_pending}) must be at least max_inputs "
                             f"({max_inputs}), or no full request could ever be queued")
        self.directory = Path(directory).expanduser()
        self.access = Access(token, allow_learn)
        self.allow_learn = self.access.can_change
        self.inbox = inbox
        self._observed = {"inputs": 0, "reject_inputs": 0, "unknown": 0}
        self._observed_lock = threading.Lock()
        self.max_batch, self.max_inputs = max_batch, max_inputs
        self.max_body, self.max_pixels = max_body, max_pixels
        self.max_pending, self.timeout, self.batch_seconds = max_pending, timeout, batch_seconds
        self.poll, self.device, self.precision = poll, device, precision
        self._decoding = threading.BoundedSemaphore(max_decoding)
        from ..backbones.base import KeptCasts

        self._casts = KeptCasts()  # the prediction worker's
        self._learn_lock = threading.Lock()
        self._problem: str | None = None  # why the current version is not the one served
        self._failed: tuple[str, float] | None = None  # a version that failed to load, when
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._scheduler = PredictionScheduler(self._run, max_batch=max_batch,
                                              max_pending=max_pending,
                                              batch_seconds=batch_seconds)
        self._learner = self._load()
        if inbox is not None:
            self._unlearned(self._learner)  # removes what the version learned already

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "ModelService":
        """Start the prediction worker and the version poller (idempotent)."""
        self._stop.clear()
        self._scheduler.start()
        if self.poll > 0 and self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="gdacil-poll", daemon=True)
            self._watcher.start()
        return self

    def close(self) -> None:
        """Stop the threads; requests still waiting are refused with status 503."""
        self._stop.set()
        self._scheduler.close(RequestError(503, "the server is shutting down"))
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None

    def __enter__(self) -> "ModelService":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ the model
    @property
    def learner(self):
        """The learner that answers now."""
        return self._learner

    def _load(self, version=None):
        from .learner import Learner

        learner = Learner.load(self.directory, version, device=self.device,
                               precision=self.precision)
        self._warm_up(learner)
        return learner

    def _warm_up(self, learner) -> None:
        """Build the backbone and score one input, so the first request is not slow, a text
        tokenizer has settled its padding state before threads share it, and the scheduler
        starts from a measured speed (one input overestimates it: the first batches are small)."""
        if learner.head is None:
            return
        if learner.modality == "text":
            sample = ["warm-up"]
        elif learner.modality == "vector":
            sample = [[0.0] * learner._dim()]  # type: ignore[list-item]
        else:
            Image = require("PIL.Image", feature="image inputs", install="pip install pillow")
            sample = [Image.new("RGB", (32, 32), (128, 128, 128))]
        started = time.perf_counter()
        learner.predict(sample)
        cost = self._costs(learner, sample)[0]
        if self._scheduler.seconds_per_cost is None:
            self._scheduler.seconds_per_cost = (time.perf_counter() - started) / cost

    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self._check_version()
            except Exception as exc:  # never let the poller die: report it on /health
                self._problem = f"checking for new versions failed: {_describe(exc)}"
                _log.exception("gdacil serve: %s", self._problem)

    def _check_version(self) -> None:
        from .bundle import current_version

        try:
            latest = current_version(self.directory)
        except (OSError, ValueError) as exc:  # a writer mid-switch, or the directory is gone
            self._problem = f"cannot read the current version of {self.directory}: {exc}"
            return
        if latest == self._learner.version:
            self._problem = None
            return
        failed = self._failed
        if failed and failed[0] == latest and time.monotonic() - failed[1] < RETRY_FAILED_LOAD:
            return
        if not self._learn_lock.acquire(blocking=False):
            return  # a learn is saving: its version is swapped in by the learn itself
        try:
            if latest != self._learner.version:
                self._learner = self._load(latest)
            self._problem, self._failed = None, None
        except Exception as exc:  # damaged, half-written, or a bug: keep serving the old one
            self._problem = f"version {latest} cannot be loaded: {_describe(exc)}"
            self._failed = (latest, time.monotonic())
            _log.warning("gdacil serve: %s; still serving %s", self._problem,
                         self._learner.version)
        finally:
            self._learn_lock.release()

    @property
    def max_separators(self) -> int:
        """The most commas, brackets and braces a body may hold: :data:`MAX_JSON_SEPARATORS`,
        or for a vectors model room for ``max_inputs`` vectors of its dimension."""
        dim = getattr(self._learner.backbone, "dim", None) \
            if self._learner.modality == "vector" else None
        return max(MAX_JSON_SEPARATORS, self.max_inputs * ((dim or 0) + 2) + 1024)

    def info(self) -> dict:
        learner = self._learner
        return {**learner.info(),
                "server": {"allow_learn": self.allow_learn, "max_batch": self.max_batch,
                           "max_inputs": self.max_inputs, "max_body": self.max_body,
                           "max_pixels": self.max_pixels, "max_pending": self.max_pending,
                           "max_separators": self.max_separators,
                           "timeout": self.timeout, "batch_seconds": self.batch_seconds,
                           "max_text_chars": _max_chars(learner),
                           "token": self.access.token is not None,
                           "inbox": None if self.inbox is None else {
                               "items": len(self.inbox), "bytes": self.inbox.bytes,
                               "max_items": self.inbox.max_items,
                               "max_bytes": self.inbox.max_bytes, "below": self.inbox.below},
                           "observed": self.observed()}}

    def health(self) -> dict:
        """``{"status": "ok", "version", "classes"}``; when the model served is not the
        directory's current one, or a worker stopped, ``status`` is ``"stale"`` or
        ``"failing"`` and ``reason`` says why (``/health`` answers those with 503)."""
        learner = self._learner
        out = {"status": "ok", "version": learner.version, "classes": len(learner.classes)}
        if not self._scheduler.alive and not self._stop.is_set():
            return {**out, "status": "failing", "reason": "the prediction worker is not running"}
        if self.poll > 0 and self._watcher is not None and not self._watcher.is_alive():
            return {**out, "status": "failing", "reason": "the version poller stopped"}
        if self._problem is not None:
            return {**out, "status": "stale", "reason": self._problem}
        return out

    # ------------------------------------------------------------------ requests
    def prepare(self, payload) -> PredictRequest:
        """Check a ``/predict`` body and decode its inputs (images are decoded here, in the
        caller's thread, a bounded number at a time)."""
        if not isinstance(payload, dict):
            raise RequestError(400, "the body must be a JSON object")
        extra = sorted(set(payload) - _PREDICT_FIELDS)
        if extra:
            raise RequestError(400, f"unknown fields: {', '.join(extra)} (predict takes "
                                    f"{', '.join(map(repr, sorted(_PREDICT_FIELDS)))})")
        top_k = payload.get("top_k", 1)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise RequestError(400, f"'top_k' must be a positive integer; got {top_k!r}")
        reject = payload.get("reject", False)
        if not isinstance(reject, bool):
            raise RequestError(400, f"'reject' must be true or false; got {reject!r}")
        reject_rate = _share(payload, "reject_rate", "the target false-rejection rate")
        if reject_rate is not None and not reject:
            raise RequestError(400, "'reject_rate' applies with \"reject\": true only")
        if reject_rate is not None and reject_rate < MIN_REJECT_RATE:
            raise RequestError(400, f"'reject_rate' must be at least {MIN_REJECT_RATE:g} over "
                                    f"HTTP; got {reject_rate!r}")
        sets = _share(payload, "sets", "the conformal sets' miscoverage alpha")
        learner = self._learner
        try:  # before any input is decoded or queued: a model without calibration says why
            if reject:
                learner.rejection_threshold(reject_rate)
            if sets is not None:
                learner._calibrated_for("conformal prediction sets")
        except ValueError as exc:
            raise RequestError(400, str(exc)) from None
        items = self._inputs(payload)
        return PredictRequest(items, self._costs(learner, items), top_k, reject, reject_rate,
                              sets, tuple(payload["inputs"]))

    def _inputs(self, payload) -> list:
        inputs = payload.get("inputs")
        if not isinstance(inputs, list) or not inputs:
            raise RequestError(400, "'inputs' must be a non-empty list")
        if len(inputs) > self.max_inputs:
            raise RequestError(400, f"{len(inputs)} inputs in one request; at most "
                                    f"{self.max_inputs}")
        if self._learner.modality == "vector":
            return _vectors(self._learner, inputs)
        for i, x in enumerate(inputs):
            if not isinstance(x, str):
                raise RequestError(400, f"inputs[{i}] is a {type(x).__name__}, not a string")
            if not _encodable(x):
                raise RequestError(400, f"inputs[{i}] is not valid Unicode (it holds a lone "
                                        "surrogate)")
        if self._learner.modality == "text":
            return inputs
        return [self._image(x, i) for i, x in enumerate(inputs)]

    def _image(self, text: str, i: int):
        """An image input decoded as ``gdacil learn`` and ``gdacil predict`` decode files."""
        from .data import load_image

        if text.startswith("data:"):
            text = text.partition(",")[2]
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(400, f"inputs[{i}] is not base64 (this model classifies "
                                    "images: send base64-encoded image files)") from None
        with self._decoding:
            try:
                return load_image(raw, max_pixels=self.max_pixels, name=f"inputs[{i}]")
            except ValueError as exc:
                raise RequestError(400, str(exc)) from None

    @staticmethod
    def _costs(learner, items: list) -> list[float]:
        """The work of each input: about its tokens for a text (the backbone bounds them),
        1 for an image (every image is resized to the backbone's size)."""
        if learner.modality != "text":
            return [1.0] * len(items)
        longest = getattr(learner.backbone, "max_length", None) or float("inf")
        return [min(len(x) / 4 + 2, longest) for x in items]

    def submit(self, request: PredictRequest) -> Future:
        """Queue a prepared request; the future gives ``[(version, Prediction), ...]``."""
        try:
            return self._scheduler.submit(self._learner, request.items, request.costs,
                                          top_k=request.top_k, timeout=self.timeout,
                                          options=request.options)
        except Busy as exc:
            raise RequestError(503, str(exc)) from None

    def _run(self, learner, items: list, top_k: int, **options) -> list:
        """``[(version, Prediction), ...]`` of ``items`` (``options``: the requests' options,
        :attr:`PredictRequest.options`). Texts are scored in groups of similar length (within a
        factor 2), so a short text is not padded to a long one's length and a forward costs
        what the scheduler estimated (the sum of its inputs' costs)."""
        self._casts.keep(learner.backbone)  # this worker only predicts: keep bf16 casts
        predictions: list = [None] * len(items)
        for group in _similar_costs(self._costs(learner, items)):
            for i, p in zip(group, learner.predict([items[i] for i in group], top_k=top_k,
                                                   **options)):
                predictions[i] = (learner.version, p)
        return predictions

    def answer(self, request: PredictRequest, results: list) -> dict:
        """The ``/predict`` answer of ``request`` from its results."""
        out = {"version": results[0][0],
               "predictions": [p.to_list()[:request.top_k] for _, p in results]}
        if request.reject:
            out["unknown"] = [p.unknown for _, p in results]
            out["novelty"] = [p.novelty for _, p in results]
            out["threshold"] = results[0][1].threshold
        if request.sets is not None:
            out["sets"] = [list(p.prediction_set) for _, p in results]
        with self._observed_lock:
            self._observed["inputs"] += len(results)
            if request.reject:
                self._observed["reject_inputs"] += len(results)
                self._observed["unknown"] += sum(p.unknown for _, p in results)
        return out

    def observed(self) -> dict:
        """Since the service started: ``inputs`` answered, ``reject_inputs`` (those whose
        request asked ``"reject": true``) and ``unknown`` (those answered unknown)."""
        with self._observed_lock:
            return dict(self._observed)

    def keep(self, request: PredictRequest, answer: dict) -> None:
        """Offer each input of an answered request to the inbox (when there is one)."""
        if self.inbox is None:
            return
        for i, sent in enumerate(request.sent):
            entry = {"predictions": answer["predictions"][i]}
            for key, name in (("unknown", "unknown"), ("novelty", "novelty"), ("sets", "set")):
                if key in answer:
                    entry[name] = answer[key][i]
            if "threshold" in answer:
                entry["threshold"] = answer["threshold"]
            try:
                self.inbox.offer(sent, entry, answer["version"])
            except OSError as exc:  # a full disk costs the inbox an item, never an answer
                _log.warning("gdacil serve: the inbox could not keep an input: %s",
                             _os_problem(exc))
            except Exception:  # nor does a failure of the inbox itself: the log has it
                _log.exception("gdacil serve: the inbox failed to keep an input")

    def predict(self, payload) -> dict:
        """Answer ``{"inputs": [...], "top_k": k}`` (see the module's documentation)."""
        request = self.prepare(payload)
        future = self.submit(request)
        try:
            results = future.result(timeout=self.timeout + 1)
        except Exception as exc:
            raise refusal(exc) from None
        answer = self.answer(request, results)
        self.keep(request, answer)
        return answer

    def learn(self, payload) -> dict:
        """Answer ``{"inputs": [...], "labels": [...]}``: learn on a copy, save it as a new
        version, then swap it in. Learns run one at a time; a learn that fails writes nothing."""
        from .names import class_name

        self._check_can_change()
        if not isinstance(payload, dict):
            raise RequestError(400, "the body must be a JSON object")
        extra = sorted(set(payload) - {"inputs", "labels"})
        if extra:
            raise RequestError(400, f"unknown fields: {', '.join(extra)} (learn takes "
                                    "'inputs' and 'labels')")
        inputs = self._inputs(payload)
        labels = payload.get("labels")
        if not isinstance(labels, list) or len(labels) != len(inputs):
            raise RequestError(400, "'labels' must be a list of class names, one per input")
        try:
            labels = [class_name(y, f"labels[{i}]") for i, y in enumerate(labels)]
        except ValueError as exc:
            raise RequestError(400, str(exc)) from None
        with self._learn_lock:
            return self._learn(inputs, labels)

    def _learn(self, inputs: list, labels: list[str], event: dict | None = None) -> dict:
        """Learn checked ``inputs`` with their class names ``labels`` (see :meth:`learn`), the
        learn lock held; ``event``: more fields for the history's learn event."""
        from .bundle import BundleError

        learner = self._learner.copy()
        try:
            report = learner.learn(inputs, labels, event=event)
            answer = {"new": list(report.new), "updated": list(report.updated),
                      "classes": len(learner.classes), "report": str(report)}
            json.dumps(answer)  # an answer that cannot be sent must fail before the save
            version = learner.save(self.directory)
        except BundleError as exc:
            raise RequestError(409, str(exc)) from None
        except ValueError as exc:
            raise RequestError(400, str(exc)) from None
        except OSError as exc:  # a read-only or full disk: nothing of this learn is kept
            raise RequestError(503, f"the learn could not be saved: {_os_problem(exc)}; "
                                    "the model is unchanged") from None
        self._learner, self._problem, self._failed = learner, None, None
        return {"version": version, **answer}

    # ------------------------------------------------------------------ the console's operations
    # Versions, rollback and the inbox: what the console at / shows and does, as JSON endpoints
    # any client may call (with the token, when the server has one).
    def authorize(self, authorization: str | None, *, change: bool) -> None:
        """Refuse (401, 403) a request with the ``Authorization`` header ``authorization``
        unless :mod:`gdacil.learner.access` grants it; ``change``: it changes state (else it
        reads the console's data)."""
        refused = self.access.refusal(authorization, change=change)
        if refused is not None:
            raise RequestError(*refused)

    def _check_can_change(self) -> None:
        if not self.allow_learn:
            raise RequestError(*self.access.refusal(None, change=True))  # type: ignore[misc]

    def versions(self) -> dict:
        """``{"serving": "v3", "versions": [...]}``: every saved version, oldest first, as
        ``gdacil versions --format json`` lists them."""
        from .bundle import versions

        return {"serving": self._learner.version,
                "versions": [v.to_dict() for v in versions(self.directory)]}

    def rollback(self, payload) -> dict:
        """Answer ``{"version": "v2"}``: make that version current (after verifying its files)
        and serve it; ``{"version": "v2", "classes": 3}``."""
        from .bundle import BundleError, rollback

        self._check_can_change()
        if not isinstance(payload, dict) or set(payload) != {"version"}:
            raise RequestError(400, 'rollback takes {"version": "v2"}')
        version = payload["version"]
        if isinstance(version, bool) or not isinstance(version, (str, int)):
            raise RequestError(400, f"'version' must be a version name such as \"v2\"; got "
                                    f"{version!r}")
        with self._learn_lock:
            try:
                info = rollback(self.directory, version)
                learner = self._load(info.name)
            except BundleError as exc:  # a name that is no version of this model
                raise RequestError(404, str(exc)) from None
            except ValueError as exc:  # its files are damaged: CURRENT is unchanged
                raise RequestError(409, str(exc)) from None
            except OSError as exc:
                raise RequestError(503, f"the rollback could not be saved: {_os_problem(exc)}")\
                    from None
            self._learner, self._problem, self._failed = learner, None, None
        return {"version": learner.version, "classes": len(learner.classes)}

    def _inbox(self):
        if self.inbox is None:
            raise RequestError(404, "this server keeps no inbox (start it with --inbox DIR)")
        return self.inbox

    def inbox_list(self, offset: int = 0, limit: int = 100) -> dict:
        """The items of the inbox, oldest first, from ``offset``, at most ``limit``; with the
        inbox's counts and bounds."""
        inbox = self._inbox()
        items = inbox.items()
        return {"items": [item.to_dict() for item in items[offset:offset + limit]],
                "total": len(items), "labelled": sum(i.label is not None for i in items),
                "bytes": inbox.bytes, "max_items": inbox.max_items,
                "max_bytes": inbox.max_bytes, "dropped": inbox.dropped}

    def inbox_label(self, item_id: str, payload) -> dict:
        """Answer ``{"label": "cat"}`` (null: take the label back) for item ``item_id``."""
        from .names import class_name

        self._check_can_change()
        inbox = self._inbox()
        if not isinstance(payload, dict) or set(payload) != {"label"}:
            raise RequestError(400, 'labelling takes {"label": "class name"}')
        label = payload["label"]
        try:
            label = None if label is None else class_name(label, "label")
            return inbox.label(item_id, label).to_dict()
        except KeyError as exc:
            raise RequestError(404, exc.args[0]) from None
        except OSError as exc:
            raise RequestError(503, f"the label could not be saved: {_os_problem(exc)}") \
                from None
        except ValueError as exc:
            raise RequestError(409 if "full" in str(exc) else 400, str(exc)) from None

    def inbox_discard(self, item_id: str, payload) -> dict:
        """Delete item ``item_id`` (the body: ``{}``)."""
        self._check_can_change()
        inbox = self._inbox()
        if payload not in (None, {}):
            raise RequestError(400, "discarding takes an empty JSON object {}")
        try:
            inbox.discard(item_id)
        except KeyError as exc:
            raise RequestError(404, exc.args[0]) from None
        return {"discarded": item_id}

    def inbox_learn(self) -> dict:
        """Learn every labelled item of the inbox in one learn (one new version, whose history
        records the items' keys), then remove them: :meth:`learn`'s answer with ``"learned"``,
        the ids. Items the current version learned already are removed, not learned again."""
        self._check_can_change()
        self._inbox()  # 404 without one
        # the lock spans the check against the history and the learn: the version cannot
        # change in between, and two inbox learns cannot both take an item
        with self._learn_lock:
            labelled = self._unlearned(self._learner)
            if not labelled:
                raise RequestError(400, "no labelled inbox items to learn")
            inputs: list = []
            for start in range(0, len(labelled), self.max_inputs):  # decoded as requests are
                inputs += self._inputs({"inputs": [i.input for i in
                                                   labelled[start:start + self.max_inputs]]})
            answer = self._learn(inputs, [cast(str, i.label) for i in labelled],
                                 {"inbox": [i.key for i in labelled]})
            self._remove_learned(labelled, answer["version"])
        return {**answer, "learned": [i.id for i in labelled]}

    def _unlearned(self, learner) -> list:
        """The labelled inbox items ``learner`` has not learned; those its history says an inbox
        learn learned (its process died before removing them) are removed."""
        learned = {key for event in learner.history for key in event.get("inbox", ())}
        labelled = self.inbox.labelled()
        done = [i for i in labelled if i.key in learned]
        if done:
            _log.warning("gdacil serve: version %s has learned %d labelled inbox items "
                         "already; removing them", learner.version, len(done))
            self._remove_learned(done, learner.version)
        return [i for i in labelled if i.key not in learned]

    def _remove_learned(self, items: list, version: str | None) -> None:
        """Remove inbox ``items`` that ``version`` learned; a disk that refuses leaves them, to
        be skipped and removed by the next inbox learn."""
        try:
            self.inbox.remove(items)
        except OSError as exc:
            _log.warning("gdacil serve: %d inbox items version %s learned could not be "
                         "removed (%s); they will not be learned again", len(items), version,
                         _os_problem(exc))


def _vectors(learner, inputs: list) -> list:
    """The vectors of a request (lists of numbers of the model's dimension), or a 400 naming
    the first bad input."""
    from .vectors import as_vectors

    try:
        return list(as_vectors(inputs, learner._dim()))
    except ValueError as exc:
        raise RequestError(400, str(exc)) from None


#: The fields of a ``/predict`` body
_PREDICT_FIELDS = frozenset({"inputs", "top_k", "reject", "reject_rate", "sets"})


def _share(payload: dict, name: str, what: str) -> float | None:
    """Field ``name`` of ``payload``: None when absent, else a number strictly between 0 and
    1 (``what`` it is, for the message)."""
    value = payload.get(name)
    if value is None:
        return None
    try:
        return check_fraction(value, f"'{name}' ({what})")
    except ValueError as exc:
        raise RequestError(400, str(exc)) from None


def refusal(exc: BaseException) -> RequestError:
    """The :class:`RequestError` that answers a failed prediction."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, (Expired, TimeoutError)):
        return RequestError(503, "the request was not answered within the server's timeout; "
                                 "the server is overloaded, try again shortly")
    if isinstance(exc, ValueError):
        return RequestError(400, str(exc))
    return RequestError(500, f"the prediction failed: {_describe(exc)}")


def _similar_costs(costs: list[float]) -> list[list[int]]:
    """Positions of ``costs`` in groups whose largest cost is at most twice the smallest."""
    groups: list[list[int]] = []
    for i in sorted(range(len(costs)), key=costs.__getitem__):
        if groups and costs[i] <= 2 * costs[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _os_problem(exc: OSError) -> str:
    """What an ``OSError`` says, with the file it concerns."""
    what = exc.strerror or _describe(exc)
    return f"{what}: {exc.filename}" if exc.filename else what


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _max_chars(learner) -> int | None:
    """The longest text the backbone reads (longer ones are cut before tokenising)."""
    if learner.modality != "text":
        return None
    return getattr(learner.backbone, "max_chars", None)


_pauses = {"count": 0, "was_enabled": False}  # parses in flight, and the collector before them
_pauses_lock = threading.Lock()


@contextmanager
def _collector_paused():
    """The cyclic garbage collector off while JSON is parsed: the containers a parse creates
    hold no cycles, and a collection per 700 of them makes parsing quadratic (a million nested
    lists: 1.4 s, 0.35 s with the collector off)."""
    with _pauses_lock:
        if _pauses["count"] == 0:
            _pauses["was_enabled"] = gc.isenabled()
            gc.disable()
        _pauses["count"] += 1
    try:
        yield
    finally:
        with _pauses_lock:
            _pauses["count"] -= 1
            if _pauses["count"] == 0 and _pauses["was_enabled"]:
                gc.enable()


def _json_body(body: bytes, limit: int = MAX_JSON_SEPARATORS):
    """The JSON value of a request body (:class:`~gdacil.learner.guards.RequestGuard` has
    checked that it was sent as ``application/json``). Parsing holds the interpreter, so a body
    with more than ``limit`` commas, brackets and braces
    (:attr:`ModelService.max_separators`) is refused unparsed."""
    separators = body.count(b",") + body.count(b"[") + body.count(b"{")
    if separators > limit:
        raise RequestError(413, f"the body holds {separators:,} commas, brackets and braces "
                                f"(in its texts too); at most {limit:,}")
    try:
        with _collector_paused():
            return json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise RequestError(400, "bad request body: not UTF-8 text") from None
    except RecursionError:
        raise RequestError(400, "bad request body: JSON nested too deeply") from None
    except ValueError as exc:
        raise RequestError(400, f"bad request body: not JSON ({exc})") from None


def create_app(service: ModelService, *, allowed_hosts=("localhost", "127.0.0.1"),
               any_address: bool = False):
    """A FastAPI application serving ``service`` (started and closed with the application),
    answering the ``Host`` names ``allowed_hosts`` (and any IP address with ``any_address``),
    behind the checks of :mod:`gdacil.learner.guards`, the grant of :mod:`gdacil.learner.access`
    on every change, and counted in ``/metrics`` (:mod:`gdacil.learner.metrics`, one registry
    per application); the console's page is ``/``.

    Handlers never block the event loop: bodies are parsed and images decoded in the thread
    pool, predictions wait on the scheduler's future, learns run in the thread pool. Every
    answer, errors included, is JSON. (This module does not postpone annotations: FastAPI reads
    the handlers' ``Request`` annotations, which are local to this function.)
    """
    require("fastapi", feature="gdacil serve", install=INSTALL)
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse as FastJSONResponse
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect

    from .. import __version__

    class JSONResponse(FastJSONResponse):
        """UTF-8 JSON; an answer that echoes a lone surrogate of the request (a label, a field
        name) is sent with ``\\u`` escapes instead of failing to encode."""

        def render(self, content) -> bytes:
            try:
                return super().render(content)
            except UnicodeEncodeError:
                return json.dumps(content, ensure_ascii=True, allow_nan=False,
                                  separators=(",", ":")).encode("ascii")

    @asynccontextmanager
    async def lifespan(app):
        await run_in_threadpool(service.start)
        yield
        await run_in_threadpool(service.close)

    app = FastAPI(title="gdacil", version=__version__, lifespan=lifespan,
                  description=__doc__.split("\n\n")[0], default_response_class=JSONResponse,
                  redirect_slashes=False)
    app.add_middleware(BodyLimit, limit=service.max_body)
    app.add_middleware(RequestGuard, hosts=allowed_hosts, any_address=any_address)
    metrics = app.state.metrics = ServerMetrics(service)

    def granted(request: Request, *, change: bool) -> None:
        service.authorize(request.headers.get("authorization"), change=change)

    @app.exception_handler(RequestError)
    async def refused(request: Request, exc: RequestError):
        return JSONResponse({"error": str(exc)}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(ClientDisconnect)
    async def disconnected(request: Request, exc: ClientDisconnect):
        # the client's event, not the server's: nobody is left to read an answer
        _log.debug("gdacil serve: the client of %s %s disconnected before its body arrived",
                   request.method, request.url.path)
        return JSONResponse({"error": "the client disconnected"}, status_code=400)

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception):
        _log.error("gdacil serve: %s %s failed", request.method, request.url.path,
                   exc_info=exc)
        return JSONResponse({"error": f"internal error ({_describe(exc)}); the server's log "
                                      "has the details"}, status_code=500)

    async def body_of(raw: bytes):
        return await run_in_threadpool(_json_body, raw, service.max_separators)

    async def body(request: Request):
        return await body_of(await request.body())

    @app.get("/health")
    async def health():
        answer = service.health()
        return JSONResponse(answer, status_code=200 if answer["status"] == "ok" else 503)

    @app.get("/info")
    async def info():
        return await run_in_threadpool(service.info)

    @app.post("/predict")
    async def predict(request: Request):
        prepared = await run_in_threadpool(service.prepare, await body(request))
        future = service.submit(prepared)
        try:
            results = await asyncio.wait_for(asyncio.wrap_future(future), service.timeout + 1)
        except Exception as exc:
            future.cancel()
            raise refusal(exc) from None
        answer = service.answer(prepared, results)
        if service.inbox is not None:  # its writes wait on the disk: off the event loop
            await run_in_threadpool(service.keep, prepared, answer)
        return answer

    @app.post("/learn")
    async def learn(request: Request):
        granted(request, change=True)
        return await run_in_threadpool(service.learn, await body(request))

    _console_routes(app, service, body, granted)
    app.add_middleware(RequestMetrics, metrics=metrics, routes=app.router.routes)  # outermost
    return app


def _console_routes(app, service: ModelService, body, granted) -> None:
    """The routes of the console (:mod:`gdacil.learner.console`) and of the operations it
    calls: versions, rollback, the inbox, the metrics."""
    from fastapi import Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import Response

    @app.get("/")
    async def console():
        return Response(_console_file("index.html"), media_type="text/html; charset=utf-8",
                        headers=CONSOLE_HEADERS)

    @app.get("/console/{name}")
    async def console_file(name: str):
        if name not in CONSOLE_FILES:
            raise RequestError(404, f"no console file {name!r}")
        return Response(_console_file(name), media_type=CONSOLE_FILES[name],
                        headers=CONSOLE_HEADERS)

    @app.get("/metrics")
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/versions")
    async def versions(request: Request):
        granted(request, change=False)
        return await run_in_threadpool(service.versions)

    @app.post("/rollback")
    async def rollback(request: Request):
        granted(request, change=True)
        return await run_in_threadpool(service.rollback, await body(request))

    @app.get("/inbox")
    async def inbox(request: Request):
        granted(request, change=False)
        query = request.query_params
        offset, limit = query.get("offset", "0"), query.get("limit", "100")
        if not (offset.isdigit() and limit.isdigit() and 1 <= int(limit) <= 1000):
            raise RequestError(400, f"'offset' must be an integer >= 0 and 'limit' one from 1 "
                                    f"to 1000; got offset={offset!r}, limit={limit!r}")
        return await run_in_threadpool(service.inbox_list, int(offset), int(limit))

    @app.post("/inbox/learn")
    async def inbox_learn(request: Request):
        granted(request, change=True)
        return await run_in_threadpool(service.inbox_learn)

    @app.post("/inbox/{item}/label")
    async def inbox_label(item: str, request: Request):
        granted(request, change=True)
        return await run_in_threadpool(service.inbox_label, item, await body(request))

    @app.post("/inbox/{item}/discard")
    async def inbox_discard(item: str, request: Request):
        granted(request, change=True)
        raw = await request.body()
        payload = (await run_in_threadpool(_json_body, raw, service.max_separators)
                   if raw.strip() else None)
        return await run_in_threadpool(service.inbox_discard, item, payload)


#: The console's files and their media types
CONSOLE_FILES = {"index.html": "text/html; charset=utf-8",
                 "console.js": "text/javascript; charset=utf-8",
                 "console.css": "text/css; charset=utf-8"}
#: The console loads nothing from elsewhere, runs no inline script, and is never framed (a page
#: of another site framing it could trick the operator into clicking its buttons)
CONSOLE_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                              "frame-ancestors 'none'; form-action 'none'",
                   "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
                   "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


def _console_file(name: str) -> bytes:
    from importlib.resources import files

    return files("gdacil.learner").joinpath("console").joinpath(name).read_bytes()


def serve(directory, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
          max_connections: int = 256, allowed_hosts=(), **options) -> None:
    """Serve the model in ``directory`` until interrupted, in this one process (``options``:
    :class:`ModelService`'s). Connections beyond ``max_connections`` are answered 503. The
    server answers the ``Host`` names of :func:`gdacil.learner.guards.allowed_hosts` for
    ``host`` and ``allowed_hosts``."""
    uvicorn = require("uvicorn", feature="gdacil serve", install=INSTALL)
    hosts = guards.allowed_hosts(host, allowed_hosts)
    service = ModelService(directory, **options)
    print(f"gdacil: serving {directory} (version {service.learner.version}, "
          f"{len(service.learner.classes)} classes) on http://{host}:{port}"
          + ("; changes need the token" if service.access.token is not None
             else "; POST /learn allowed" if service.allow_learn else "")
          + (f"; keeping unknown inputs in {service.inbox.directory}" if service.inbox is not None else "")
          + f"; answering Host {', '.join(hosts)}"
          + (" and any IP address" if host in guards.WILDCARD_BINDS else ""), flush=True)
    app = create_app(service, allowed_hosts=hosts, any_address=host in guards.WILDCARD_BINDS)
    uvicorn.run(app, host=host, port=port, log_level=log_level,
                limit_concurrency=max_connections, timeout_graceful_shutdown=10)
