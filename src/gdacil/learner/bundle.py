"""Versioned model bundles: immutable version folders and an atomically switched ``CURRENT``.

A model directory holds::

    MODEL/
      CURRENT                  the name of the current version ("v3"), one line
      versions/
        v1/  v2/  v3/ ...      one complete, immutable folder per saved version
          manifest.json        format, version, parent, creation time, summary, and the
                               sha256 of every other file in the folder (plus its own)
          learner.json ...     what the learner stores (see gdacil.learner.learner)

Writing a version (:func:`write_version`) creates a hidden temporary folder under
``versions/``, writes every file into it (flushed to disk), writes ``manifest.json`` last,
renames the folder to ``v<N>`` (an atomic rename: the folder appears complete or not at all), and
then replaces ``CURRENT`` atomically (:func:`gdacil.io.atomic_write_text`). A reader resolves
``CURRENT`` once and reads that folder, which never changes afterwards, so it sees a complete
version whatever writers do meanwhile; a writer killed midway leaves at most a temporary folder,
removed by the next writer. Writers of one model take an exclusive lock (``MODEL/.lock``,
``fcntl.flock``), so version numbers never collide, and a writer that started from another
version than the current one is refused (:class:`BundleError`) rather than silently dropping
the other writer's classes.

Files equal to the parent version's (same path and sha256: an unchanged backbone, anchor images)
are hard links to the parent's copy where the file system allows, so versions cost only what
changed.

:func:`open_version` verifies ``manifest.json`` against its own checksum and every file it lists
against its sha256 before anything is loaded; any difference raises
:class:`~gdacil.io.CorruptFileError` naming the file. :func:`versions` lists the versions and
:func:`rollback` makes an earlier one current again (after verifying it).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import cast

from .. import __version__
from ..hashing import file_sha256, sha256_bytes, sha256_json
from ..io import (
    TEMP_NAME,
    CorruptFileError,
    atomic_write_text,
    read_json,
    remove_stale_temp_files,
    write_error,
)

__all__ = [
    "CURRENT",
    "FORMAT",
    "BundleError",
    "VersionInfo",
    "VersionWriter",
    "check_new_model_dir",
    "current_version",
    "open_version",
    "rollback",
    "sha256_file",
    "version_names",
    "versions",
    "write_version",
]

FORMAT = "gdacil.learner-bundle/1"
_FORMAT_PREFIX = "gdacil.learner-bundle/"
CURRENT = "CURRENT"
VERSIONS = "versions"
MANIFEST = "manifest.json"
_NAME = re.compile(r"v([1-9][0-9]*)")
_LOCK = ".lock"
ADVICE = ("Roll the model back to a good version (gdacil versions MODEL; gdacil rollback MODEL "
          "VERSION) or restore a copy of it.")
#: ``expect_current`` of :func:`write_version` that accepts whatever version is current
ANY = object()


class BundleError(ValueError):
    """A model directory cannot be used as asked: not a model, no such version, or changed by
    another writer since it was read."""


#: Hex sha256 of a file's bytes (:func:`gdacil.hashing.file_sha256`)
sha256_file = file_sha256


def _number(name: str) -> int:
    return int(cast("re.Match[str]", _NAME.fullmatch(name)).group(1))  # a listed version's name


def _normalise(version: str | int) -> str:
    """``"v3"`` from ``"v3"``, ``"3"`` or ``3``; ``BundleError`` for anything else."""
    text = str(version).strip()
    name = text if text.startswith("v") else f"v{text}"
    if not _NAME.fullmatch(name):
        raise BundleError(f"{version!r} is not a version name (v1, v2, ...)")
    return name


def _model_dir(directory) -> Path:
    """``directory`` if it holds a model; ``FileNotFoundError`` or :class:`BundleError` if not."""
    directory = Path(directory).expanduser()
    if not directory.exists():
        raise FileNotFoundError(f"no model at {directory} (create one with: gdacil learn "
                                f"{directory} --data PATH)")
    if not (directory / CURRENT).is_file():
        raise BundleError(f"{directory} is not a gdacil model: it has no {CURRENT} file")
    return directory


def version_names(directory) -> list[str]:
    """The saved versions of the model in ``directory``, oldest first."""
    folder = Path(directory) / VERSIONS
    if not folder.is_dir():
        return []
    return sorted((e.name for e in os.scandir(folder) if e.is_dir() and _NAME.fullmatch(e.name)),
                  key=_number)


def current_version(directory) -> str:
    """The name in ``CURRENT`` (read once), checked to name an existing version."""
    directory = _model_dir(directory)
    path = directory / CURRENT
    try:
        name = path.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError:
        name = ""
    if not _NAME.fullmatch(name):
        raise CorruptFileError(path, "does not name a version (v1, v2, ...)", ADVICE)
    if not (directory / VERSIONS / name).is_dir():
        raise CorruptFileError(path, f"names version {name}, which does not exist", ADVICE)
    return name


# ---------------------------------------------------------------------- reading
@dataclass(frozen=True)
class OpenedVersion:
    """A verified version: its ``name``, folder ``path`` and ``manifest``."""

    name: str
    path: Path
    manifest: dict

    def file(self, relative: str) -> Path:
        return self.path / relative

    def has(self, relative: str) -> bool:
        return relative in self.manifest["files"]


def _manifest(path: Path, name: str) -> dict:
    """``manifest.json`` of version ``name``, parsed and checked against its own checksum."""
    try:
        manifest = read_json(path, ADVICE)
    except FileNotFoundError:
        raise CorruptFileError(path, "missing: the version folder has no manifest", ADVICE) \
            from None
    if not isinstance(manifest, dict) or not str(manifest.get("format", "")).startswith(
            _FORMAT_PREFIX):
        raise CorruptFileError(path, "not a gdacil model manifest", ADVICE)
    if manifest.get("sha256") != sha256_json({k: v for k, v in manifest.items() if k != "sha256"}):
        raise CorruptFileError(path, "content does not match its sha256 checksum; the file was "
                                     "modified or damaged since gdacil wrote it", ADVICE)
    if manifest["format"] != FORMAT:
        raise BundleError(f"{path.parent} was written in format {manifest['format']!r} by a "
                          f"newer gdacil; this gdacil ({__version__}) reads {FORMAT!r}: upgrade "
                          "gdacil to load it")
    if manifest.get("version") != name:
        raise CorruptFileError(path, f"describes version {manifest.get('version')!r}, not the "
                                     f"folder {name} it is in", ADVICE)
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise CorruptFileError(path, "files must map each file's name to its sha256", ADVICE)
    if not isinstance(manifest.get("summary", {}), dict):
        raise CorruptFileError(path, "summary must be a mapping", ADVICE)
    return manifest


def _safe_relative(relative: str) -> bool:
    parts = PurePosixPath(relative).parts
    return bool(parts) and not PurePosixPath(relative).is_absolute() and ".." not in parts


def open_version(directory, version: str | int | None = None, *,
                 verify_files: bool = True) -> OpenedVersion:
    """Resolve ``version`` (default: ``CURRENT``, read once) and verify it: the manifest against
    its checksum, and (``verify_files``) every file it lists against its sha256.

    Raises ``FileNotFoundError`` when there is no model, :class:`BundleError` for an unknown
    version or a directory that is not a model, and :class:`~gdacil.io.CorruptFileError` naming
    the file that is missing, damaged or altered.
    """
    directory = _model_dir(directory)
    if version is None:
        name = current_version(directory)
    else:
        name = _normalise(version)
        if not (directory / VERSIONS / name).is_dir():
            known = ", ".join(version_names(directory)) or "none"
            raise BundleError(f"{directory} has no version {name} (versions: {known})")
    path = directory / VERSIONS / name
    manifest = _manifest(path / MANIFEST, name)
    for relative, digest in manifest["files"].items():
        file = path / relative
        if not _safe_relative(relative) or relative == MANIFEST:
            raise CorruptFileError(path / MANIFEST, f"lists an invalid file name {relative!r}",
                                   ADVICE)
        if not verify_files:
            continue
        if not file.is_file():
            raise CorruptFileError(file, "missing, though manifest.json lists it", ADVICE)
        if sha256_file(file) != digest:
            raise CorruptFileError(file, "content does not match the sha256 that manifest.json "
                                         "records for it; the file was modified or damaged "
                                         "since gdacil wrote it", ADVICE)
    return OpenedVersion(name, path, manifest)


@dataclass(frozen=True)
class VersionInfo:
    """One saved version, as :func:`versions` lists it."""

    name: str
    created: str | None
    parent: str | None
    summary: dict
    current: bool
    problem: str | None = None  # why its manifest cannot be read, if it cannot

    def to_dict(self) -> dict:
        return {"version": self.name, "created": self.created, "parent": self.parent,
                "current": self.current, **self.summary,
                **({"problem": self.problem} if self.problem else {})}


def versions(directory) -> list[VersionInfo]:
    """Every saved version, oldest first, with the summary its manifest records. A version
    whose manifest cannot be read is listed with its ``problem`` (files are not verified here:
    :func:`open_version` and :func:`rollback` do that)."""
    directory = _model_dir(directory)
    try:
        current = current_version(directory)
    except CorruptFileError:
        current = None
    out = []
    for name in version_names(directory):
        try:
            m = _manifest(directory / VERSIONS / name / MANIFEST, name)
        except (CorruptFileError, BundleError) as exc:
            out.append(VersionInfo(name, None, None, {}, name == current, str(exc)))
            continue
        out.append(VersionInfo(name, m.get("created"), m.get("parent"), m.get("summary", {}),
                               name == current))
    return out


def rollback(directory, version: str | int) -> VersionInfo:
    """Make ``version`` current again (after verifying all its files); later versions are kept,
    and the next saved version gets the next free number. Returns its :class:`VersionInfo`."""
    directory = _model_dir(directory)
    with _locked(directory):
        opened = open_version(directory, version)
        _switch(directory, opened.name)
    return next(v for v in versions(directory) if v.name == opened.name)


# ---------------------------------------------------------------------- writing
@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive lock among the writers of the model in ``directory`` (a no-op where
    ``fcntl`` does not exist)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover (Windows)
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    lock = directory / _LOCK
    try:  # never follow a link: it could point anywhere outside the model
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or lock.is_symlink():
            raise BundleError(f"{lock} is a symbolic link; gdacil does not follow it out of the "
                              f"model directory. Remove it (rm {lock}) and retry") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BundleError(f"{lock} is not a regular file; remove it and retry")
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            # what writers killed midway (kill -9) left of their atomic writes of CURRENT:
            # every writer of this folder holds the lock, so none of them is still writing
            remove_stale_temp_files(directory, max_age=0)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every file system lets a directory be synced
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _switch(directory: Path, name: str) -> None:
    atomic_write_text(directory / CURRENT, f"{name}\n")
    _fsync_dir(directory)


class VersionWriter:
    """Writes the files of a new version into its temporary folder (``path``), linking files
    that equal the parent version's instead of copying them."""

    def __init__(self, name: str, path: Path, parent: OpenedVersion | None):
        self.name, self.path, self.parent = name, path, parent
        self.files: dict[str, str] = {}

    def _target(self, relative: str) -> Path:
        if not _safe_relative(relative) or relative == MANIFEST or relative in self.files:
            raise ValueError(f"cannot write {relative!r} into a version")
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def _link_parent(self, relative: str, digest: str, target: Path) -> bool:
        """Hard-link the parent's ``relative`` to ``target`` if it has that content."""
        if self.parent is None or self.parent.manifest["files"].get(relative) != digest:
            return False
        source = self.parent.file(relative)
        try:
            if sha256_file(source) != digest:
                return False
            tmp = target.with_name(f".{target.name}.link")
            os.link(source, tmp)
            os.replace(tmp, target)
        except OSError:  # no hard links here (or the parent moved): keep a copy
            return False
        return True

    def link(self, relative: str) -> bool:
        """Take the parent's ``relative`` as it is (a hard link, after verifying it); False
        when the parent has no such file, it does not verify, or links are not possible."""
        digest = self.parent.manifest["files"].get(relative) if self.parent else None
        if digest is None or not self._link_parent(relative, digest, self._target(relative)):
            return False
        self.files[relative] = digest
        return True

    def write_bytes(self, relative: str, data: bytes) -> None:
        target = self._target(relative)
        digest = sha256_bytes(data)
        if not self._link_parent(relative, digest, target):
            _write_file(target, data)
        self.files[relative] = digest

    def write_json(self, relative: str, payload) -> None:
        self.write_bytes(relative, json.dumps(payload, indent=1, sort_keys=True).encode("utf-8"))

    def write_with(self, relative: str, write: Callable[[Path], object]) -> None:
        """``write(path)`` writes the file (e.g. :func:`gdacil.io.save_tensors`, which flushes
        it to disk). A tensor file whose content equals the parent's is linked even when its
        bytes differ: safetensors does not write its metadata in a fixed order."""
        target = self._target(relative)
        write(target)
        digest = sha256_file(target)
        theirs = self.parent.manifest["files"].get(relative) if self.parent else None
        if (theirs not in (None, digest) and relative.endswith(".safetensors")
                and _tensors_checksum(target) == _tensors_checksum(
                    cast(OpenedVersion, self.parent).file(relative))):  # theirs: a parent
            digest = theirs  # linked below, once the parent's file is verified
        if not self._link_parent(relative, digest, target):
            digest = sha256_file(target)
        self.files[relative] = digest


def _write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (a file of a version's temporary folder), flushed to disk; an
    ``OSError`` names ``path`` and keeps its errno (a full disk, a file-size limit)."""
    try:
        with open(path, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise write_error(exc, path) from None


def _tensors_checksum(path: Path) -> str | None:
    """The content checksum :func:`gdacil.io.save_tensors` stores in a file's metadata."""
    try:
        import safetensors

        with safetensors.safe_open(str(path), framework="pt") as fh:
            return (fh.metadata() or {}).get("gdacil.sha256")
    except Exception:  # unreadable: no checksum, so no link
        return None


def check_new_model_dir(directory) -> Path:
    """``directory`` if a new model can be written there: it does not exist, is empty, or holds
    a model; :class:`BundleError` otherwise (a file, or a folder of other things)."""
    directory = Path(directory).expanduser()
    if directory.exists() and not directory.is_dir():
        raise BundleError(f"{directory} is a file, not a model directory")
    if (directory.is_dir() and not (directory / CURRENT).exists()
            and any(e.name not in (_LOCK, VERSIONS) and not TEMP_NAME.fullmatch(e.name)
                    for e in os.scandir(directory))):
        raise BundleError(f"{directory} is not empty and not a gdacil model; save the model "
                          "in a new or empty directory")
    return directory


def write_version(directory, write: Callable[[VersionWriter], dict], *, expect_current=ANY,
                  parent: str | None = None) -> str:
    """Write a new version of the model in ``directory`` and make it current; returns its name.

    ``write(writer)`` writes the files (``writer.name`` is the new version's name) and returns a
    JSON-able summary for :func:`versions`. ``expect_current``: the version the caller started
    from (``None``: a new model), checked under the lock: if another writer made another version
    current meanwhile, :class:`BundleError` is raised and nothing is written; :data:`ANY` skips
    the check. ``parent`` (default: the current version) is recorded in the manifest, and
    files equal to its files are linked.
    """
    directory = check_new_model_dir(directory)
    with _locked(directory):
        current = current_version(directory) if (directory / CURRENT).exists() else None
        if expect_current is not ANY and current != expect_current:
            raise BundleError(
                f"{directory}: version {current} is current now, not "
                f"{expect_current or 'none'}, which this model was read from (another learn, "
                "forget or rollback ran since, or an earlier version was loaded); load the "
                "current version and repeat, or roll back first")
        folder = directory / VERSIONS
        folder.mkdir(parents=True, exist_ok=True)
        for entry in os.scandir(folder):  # what writers killed midway left (we hold the lock)
            if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                shutil.rmtree(entry.path, ignore_errors=True)
        names = version_names(directory)
        name = f"v{_number(names[-1]) + 1 if names else 1}"
        parent = parent if parent is not None else current
        # the parent's files are verified one by one, as they are linked
        base = open_version(directory, parent, verify_files=False) if parent else None
        tmp = Path(tempfile.mkdtemp(dir=folder, prefix=f".{name}.", suffix=".tmp"))
        try:
            writer = VersionWriter(name, tmp, base)
            summary = write(writer)
            manifest = {"format": FORMAT, "version": name, "parent": parent,
                        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "gdacil": __version__, "files": dict(sorted(writer.files.items())),
                        "summary": summary}
            manifest["sha256"] = sha256_json(manifest)
            _write_file(tmp / MANIFEST, json.dumps(manifest, indent=1).encode("utf-8"))
            for sub, _, _ in os.walk(tmp):
                _fsync_dir(Path(sub))
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; models are meant to be shared
            os.rename(tmp, folder / name)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, OSError) and isinstance(exc.filename, str) \
                    and exc.filename.startswith(str(tmp)):  # name the file it was to become
                raise write_error(exc, folder / name / os.path.relpath(exc.filename, tmp)) \
                    from None
            raise
        _fsync_dir(folder)
        _switch(directory, name)
    return name
