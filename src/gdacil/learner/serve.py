"""``gdacil serve``: a model directory behind an HTTP JSON API.

A :class:`ModelService` holds the current version of a model and answers from it; it does not
depend on a web framework. :func:`create_app` puts it behind a FastAPI application and
:func:`serve` runs that with uvicorn (``pip install 'gdacil[serve]'``).

Endpoints (JSON in and out; every error is ``{"error": "<what is wrong>"}`` with its status):

=================  ================================================================================
``GET /health``    ``{"status": "ok", "version": "v3", "classes": 40}``
``GET /info``      what ``gdacil info --format json`` prints, plus the server's limits
``POST /predict``  ``{"inputs": [...], "top_k": 1}``: texts for a text model; base64-encoded image
                   files (or ``data:`` URLs) for an image model. Answers ``{"version": "v3",
                   "predictions": [[{"class", "score", "probability"}, ...], ...]}``, one list per
                   input, best class first
``POST /learn``    only with ``allow_learn``: ``{"inputs": [...], "labels": [...]}``. Learns on a
                   copy of the model, saves the copy as a new version, then makes it the one that
                   answers: ``{"version": "v4", "new": [...], "updated": [...], "classes": 41,
                   "report": "..."}``
=================  ================================================================================

Statuses: 400 bad input (wrong types, bad base64, an unreadable image, too many inputs or pixels),
403 ``/learn`` when learning is not allowed, 409 when another process changed the model while a
learn ran (nothing is written), 413 a body over ``max_body`` bytes, 503 while shutting down.

Predictions keep flowing while a learn runs: every batch reads the current model once, and the
learned copy replaces it with one reference assignment, after its version is saved. Versions
written by other processes (``gdacil learn``, ``gdacil rollback``) are loaded and swapped in within
``poll`` seconds. Predict requests that arrive together are answered together, in batches of up to
``max_batch`` inputs, so concurrent clients share backbone forwards.
"""

from __future__ import annotations

import base64
import binascii
import io
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from .._optional import require

__all__ = ["ModelService", "RequestError", "create_app", "serve"]

INSTALL = "pip install 'gdacil[serve]'"


class RequestError(ValueError):
    """A request the service refuses; ``status`` is its HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class _Job:
    items: list
    top_k: int
    future: Future = field(default_factory=Future)


class ModelService:
    """The current version of a model directory, answering predictions and (optionally) learns.

    Parameters
    ----------
    directory : path
        A model directory written by :meth:`gdacil.learner.Learner.save` (``gdacil learn``).
    allow_learn : bool
        Whether :meth:`learn` is allowed (``POST /learn``).
    max_batch : int
        Most inputs answered by one backbone forward when requests arrive together.
    max_inputs : int
        Most inputs in one request.
    max_body : int
        Most bytes in one request body (checked by :func:`create_app`).
    max_pixels : int
        Most pixels in one image input (checked before it is decoded).
    poll : float
        Seconds between checks for a version written by another process; 0 never checks.
    timeout : float
        Seconds a predict request waits for its answer.
    device : optional
        Device of the backbone (default: the backbone's own).

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
                 poll: float = 1.0, timeout: float = 300.0, device=None):
        for name, value in (("max_batch", max_batch), ("max_inputs", max_inputs),
                            ("max_body", max_body), ("max_pixels", max_pixels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        self.directory = Path(directory).expanduser()
        self.allow_learn = allow_learn
        self.max_batch, self.max_inputs = max_batch, max_inputs
        self.max_body, self.max_pixels = max_body, max_pixels
        self.poll, self.timeout, self.device = poll, timeout, device
        self._learner = self._load()
        self._learn_lock = threading.Lock()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ModelService:
        """Start the batching worker and the version poller (idempotent)."""
        if not self._threads:
            self._stop.clear()
            self._threads = [threading.Thread(target=self._work, name="gdacil-predict",
                                              daemon=True)]
            if self.poll > 0:
                self._threads.append(threading.Thread(target=self._watch, name="gdacil-poll",
                                                      daemon=True))
            for thread in self._threads:
                thread.start()
        return self

    def close(self) -> None:
        """Stop the threads; requests still queued are refused with status 503."""
        self._stop.set()
        self._queue.put(None)
        for thread in self._threads:
            thread.join()
        self._threads = []
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.future.set_exception(RequestError(503, "the server is shutting down"))

    def __enter__(self) -> ModelService:
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

        learner = Learner.load(self.directory, version, device=self.device)
        _warm_up(learner)
        return learner

    def _watch(self) -> None:
        from .bundle import current_version

        while not self._stop.wait(self.poll):
            try:
                latest = current_version(self.directory)
            except (OSError, ValueError):
                continue  # a writer mid-switch, or the directory is gone: keep the model
            if latest == self._learner.version or not self._learn_lock.acquire(blocking=False):
                continue
            try:
                if latest != self._learner.version:
                    self._learner = self._load(latest)
            except (OSError, ValueError):
                pass  # damaged or half-written: the next poll tries again
            finally:
                self._learn_lock.release()

    def info(self) -> dict:
        return {**self._learner.info(),
                "server": {"allow_learn": self.allow_learn, "max_batch": self.max_batch,
                           "max_inputs": self.max_inputs, "max_body": self.max_body,
                           "max_pixels": self.max_pixels}}

    def health(self) -> dict:
        learner = self._learner
        return {"status": "ok", "version": learner.version, "classes": len(learner.classes)}

    # ------------------------------------------------------------------ requests
    def _inputs(self, payload) -> list:
        if not isinstance(payload, dict):
            raise RequestError(400, "the body must be a JSON object")
        inputs = payload.get("inputs")
        if not isinstance(inputs, list) or not inputs:
            raise RequestError(400, "'inputs' must be a non-empty list")
        if len(inputs) > self.max_inputs:
            raise RequestError(400, f"{len(inputs)} inputs in one request; at most "
                                    f"{self.max_inputs}")
        bad = next((i for i, x in enumerate(inputs) if not isinstance(x, str)), None)
        if bad is not None:
            raise RequestError(400, f"inputs[{bad}] is a {type(inputs[bad]).__name__}, not a "
                                    "string")
        if self._learner.modality == "text":
            return inputs
        return [self._image(x, i) for i, x in enumerate(inputs)]

    def _image(self, text: str, i: int):
        from ..data.images import open_image
        from .data import MAX_SIDE

        Image = require("PIL.Image", feature="image inputs", install="pip install pillow")
        if text.startswith("data:"):
            text = text.partition(",")[2]
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(400, f"inputs[{i}] is not base64 (this model classifies "
                                    "images: send base64-encoded image files)") from None
        try:
            with Image.open(io.BytesIO(raw)) as im:
                width, height = im.size
            if width * height > self.max_pixels:
                raise RequestError(400, f"inputs[{i}] has {width}x{height} pixels; at most "
                                        f"{self.max_pixels} per image")
            return open_image(io.BytesIO(raw), max_side=MAX_SIDE).convert("RGB")
        except (Image.UnidentifiedImageError, Image.DecompressionBombError, OSError,
                SyntaxError) as exc:
            raise RequestError(400, f"inputs[{i}] is not an image that can be read "
                                    f"({exc})") from None

    def predict(self, payload) -> dict:
        """Answer ``{"inputs": [...], "top_k": k}`` (see the module's documentation)."""
        top_k = payload.get("top_k", 1) if isinstance(payload, dict) else 1
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise RequestError(400, f"'top_k' must be a positive integer; got {top_k!r}")
        extra = sorted(set(payload) - {"inputs", "top_k"}) if isinstance(payload, dict) else []
        if extra:
            raise RequestError(400, f"unknown fields: {', '.join(extra)} (predict takes "
                                    "'inputs' and 'top_k')")
        job = _Job(self._inputs(payload), top_k)
        if self._stop.is_set() or not self._threads:
            raise RequestError(503, "the server is not running")
        self._queue.put(job)
        return job.future.result(timeout=self.timeout)

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            jobs, n = [job], len(job.items)
            while n < self.max_batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # stop after this batch
                    break
                jobs.append(more)
                n += len(more.items)
            self._answer(jobs)

    def _answer(self, jobs: list[_Job]) -> None:
        """One forward for all ``jobs``; if it fails, each job alone, so only its own fails."""
        learner = self._learner  # read once: a swap during the batch does not mix versions
        try:
            predictions = learner.predict([x for j in jobs for x in j.items],
                                          top_k=max(j.top_k for j in jobs))
        except Exception as exc:
            if len(jobs) == 1:
                jobs[0].future.set_exception(
                    RequestError(400, str(exc)) if isinstance(exc, ValueError) else exc)
                return
            for job in jobs:
                self._answer([job])
            return
        start = 0
        for job in jobs:
            mine = predictions[start:start + len(job.items)]
            start += len(job.items)
            job.future.set_result({"version": learner.version, "predictions": [
                p.to_list()[:job.top_k] for p in mine]})

    def learn(self, payload) -> dict:
        """Answer ``{"inputs": [...], "labels": [...]}``: learn on a copy, save it as a new
        version, then swap it in. Learns run one at a time."""
        if not self.allow_learn:
            raise RequestError(403, "learning is not allowed on this server (start it with "
                                    "--allow-learn)")
        inputs = self._inputs(payload)
        labels = payload.get("labels")
        extra = sorted(set(payload) - {"inputs", "labels"})
        if extra:
            raise RequestError(400, f"unknown fields: {', '.join(extra)} (learn takes "
                                    "'inputs' and 'labels')")
        if not isinstance(labels, list) or len(labels) != len(inputs) \
                or not all(isinstance(y, str) and y for y in labels):
            raise RequestError(400, "'labels' must be a list of non-empty strings, one per input")
        from .bundle import BundleError

        with self._learn_lock:
            learner = self._learner.copy()
            try:
                report = learner.learn(inputs, labels)
                version = learner.save(self.directory)
            except BundleError as exc:
                raise RequestError(409, str(exc)) from None
            except ValueError as exc:
                raise RequestError(400, str(exc)) from None
            self._learner = learner
        return {"version": version, "new": list(report.new), "updated": list(report.updated),
                "classes": len(learner.classes), "report": str(report)}


def _warm_up(learner) -> None:
    """Build the backbone and run one prediction, so the first request is not slow and a text
    tokenizer has settled its padding state before threads share it."""
    if learner.head is None:
        return
    if learner.modality == "text":
        learner.predict(["warm-up"])
    else:
        Image = require("PIL.Image", feature="image inputs", install="pip install pillow")
        learner.predict([Image.new("RGB", (32, 32), (128, 128, 128))])


class _BodyLimit:
    """ASGI middleware: answer 413 to a request whose body is over ``limit`` bytes, by its
    Content-Length or while it streams in."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._refuse(send)
        received, started, refused = 0, False, False

        async def limited_receive():
            # Over the limit: answer 413 now and tell the application the client has gone
            # (frameworks turn errors raised while reading a body into their own 400).
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                refused = True
                if not started:
                    await self._refuse(send)
                return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            nonlocal started
            if refused:
                return  # the 413 has been sent
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not refused:
                raise

    async def _refuse(self, send):
        body = (f'{{"error": "the request body is over {self.limit} bytes"}}').encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def create_app(service: ModelService):
    """A FastAPI application serving ``service`` (started and closed with the application)."""
    require("fastapi", feature="gdacil serve", install=INSTALL)
    from contextlib import asynccontextmanager

    from fastapi import Body, FastAPI, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    from .. import __version__

    @asynccontextmanager
    async def lifespan(app):
        await run_in_threadpool(service.start)
        yield
        await run_in_threadpool(service.close)

    app = FastAPI(title="gdacil", version=__version__, lifespan=lifespan,
                  description=__doc__.split("\n\n")[0])
    app.add_middleware(_BodyLimit, limit=service.max_body)

    @app.exception_handler(RequestError)
    async def refused(request: Request, exc: RequestError):
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return JSONResponse({"error": f"bad request body: {problems}"}, status_code=400)

    @app.get("/health")
    def health():
        return service.health()

    @app.get("/info")
    def info():
        return service.info()

    @app.post("/predict")
    def predict(payload: dict = Body(...)):  # noqa: B008 (FastAPI's way to read a JSON body)
        return service.predict(payload)

    @app.post("/learn")
    def learn(payload: dict = Body(...)):  # noqa: B008
        return service.learn(payload)

    return app


def serve(directory, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
          **options) -> None:
    """Serve the model in ``directory`` until interrupted (``options``: :class:`ModelService`'s)."""
    uvicorn = require("uvicorn", feature="gdacil serve", install=INSTALL)
    service = ModelService(directory, **options)
    print(f"gdacil: serving {directory} (version {service.learner.version}, "
          f"{len(service.learner.classes)} classes) on http://{host}:{port}"
          + ("; POST /learn allowed" if service.allow_learn else ""), flush=True)
    uvicorn.run(create_app(service), host=host, port=port, log_level=log_level)
