"""Local filesystem adapter: one file per key, safe for several processes on one machine.

Key ``a/b/c.json`` is the file ``{root}/a/b/c.json``. Writes go to a temporary file in the
target directory first, so readers never see a partial object:

* put-if-absent: ``os.link(tmp, final)``, which fails atomically when ``final`` exists (where
  hard links are unsupported, an ``O_CREAT | O_EXCL`` create is used instead; a reader may then
  briefly see a partial object);
* overwrite and ``if_match``: ``os.replace`` under an ``flock`` lock shared by all processes
  (one of a few lock stripes picked by key), so If-Match compares and swaps atomically.

Files whose names start with ``.bq~`` (temporaries, locks) are internal and never listed. A key
cannot be both an object and a "directory" of other keys (``a/b`` and ``a/b/c``), which the
bucketq key layout never does.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import hashlib
import os
import secrets
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from bucketq.errors import AlreadyExists, PreconditionFailed, StorageError
from bucketq.storage.port import Blob, ObjectInfo, RequestStats

INTERNAL = ".bq~"
_LOCK_DIR = INTERNAL + "locks"
_NO_LINK = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS, errno.EXDEV})


def _md5_etag(data: bytes) -> str:
    return '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'


class FileStore:
    """:class:`~bucketq.storage.port.ObjectStore` over a local directory."""

    def __init__(self, root: Path | str, *, fsync: bool = True, lock_stripes: int = 64) -> None:
        self.root = Path(root).absolute()
        self.fsync = fsync
        self.lock_stripes = lock_stripes
        self.stats = RequestStats()
        self._ready = False
        self._etags: dict[str, tuple[tuple[int, int, int], str]] = {}

    def __repr__(self) -> str:
        return f"FileStore({str(self.root)!r})"

    # -- paths and locks ----------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or "\x00" in key or any(p in ("", ".", "..") or p.startswith(INTERNAL) for p in parts):
            raise StorageError(
                f"key {key!r} cannot be stored by the file backend "
                f"(empty, '.' or '..' segments, NUL bytes and segments starting with {INTERNAL!r} are not allowed)"
            )
        return self.root.joinpath(*parts)

    def _ensure_root(self) -> None:
        if not self._ready:
            try:
                (self.root / _LOCK_DIR).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StorageError(
                    f"file backend: cannot use directory {self.root}: {exc.strerror}"
                ) from None
            self._ready = True

    def _stripe(self, key: str) -> int:
        return zlib.crc32(key.encode()) % self.lock_stripes

    @contextlib.contextmanager
    def _locked(self, stripe: int) -> Iterator[None]:
        import fcntl  # POSIX only: imported here so that importing bucketq works everywhere

        self._ensure_root()
        fd = os.open(self.root / _LOCK_DIR / f"{stripe}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _fsync_dir(self, directory: Path) -> None:
        if not self.fsync:
            return
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_tmp(self, directory: Path, data: bytes) -> Path:
        tmp = directory / f"{INTERNAL}tmp.{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if self.fsync:
                os.fsync(fh.fileno())
        return tmp

    # -- blocking implementations -------------------------------------------------------------

    def _read(self, key: str) -> tuple[bytes, float] | None:
        path = self._path(key)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
                mtime = os.fstat(fh.fileno()).st_mtime
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StorageError(f"file backend: cannot read {key!r} at {path}: {exc.strerror}") from None
        return data, mtime

    def _put(self, key: str, data: bytes, if_none_match: bool, if_match: str | None) -> str:
        path = self._path(key)
        self._ensure_root()
        for _ in range(10):  # a concurrent delete may prune the parent directory under us
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                if if_match is None and if_none_match:
                    self._create(path, key, data)
                else:
                    self._replace(path, key, data, if_none_match, if_match)
                self._fsync_dir(path.parent)
                return _md5_etag(data)
            except FileNotFoundError:
                continue
            except (NotADirectoryError, IsADirectoryError, FileExistsError) as exc:
                raise StorageError(
                    f"file backend: key {key!r} clashes with another key used as a directory ({exc.strerror})"
                ) from None
            except OSError as exc:
                raise StorageError(f"file backend: cannot write {key!r} at {path}: {exc.strerror}") from None
        raise StorageError(f"file backend: cannot write {key!r}: its directory keeps disappearing")

    def _create(self, path: Path, key: str, data: bytes) -> None:
        tmp = self._write_tmp(path.parent, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise AlreadyExists(f"{key} already exists") from None
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                raise AlreadyExists(f"{key} already exists") from None
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                if self.fsync:
                    os.fsync(fh.fileno())
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _replace(self, path: Path, key: str, data: bytes, if_none_match: bool, if_match: str | None) -> None:
        with self._locked(self._stripe(key)):
            if if_match is not None or if_none_match:
                current = self._read(key)
                if if_none_match and current is not None:
                    raise AlreadyExists(f"{key} already exists")
                if if_match is not None and (current is None or _md5_etag(current[0]) != if_match):
                    raise PreconditionFailed(f"{key} changed (If-Match {if_match} failed)")
            tmp = self._write_tmp(path.parent, data)
            try:
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise

    def _delete(self, keys: list[str]) -> None:
        by_stripe: dict[int, list[str]] = {}
        for key in keys:
            by_stripe.setdefault(self._stripe(key), []).append(key)
        parents: set[Path] = set()
        for stripe, group in by_stripe.items():
            with self._locked(stripe):
                for key in group:
                    path = self._path(key)
                    try:
                        os.unlink(path)
                    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                        continue
                    except OSError as exc:
                        raise StorageError(f"file backend: cannot delete {key!r}: {exc.strerror}") from None
                    parents.add(path.parent)
        for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            self._prune(parent)

    def _prune(self, directory: Path) -> None:
        """Remove empty directories from ``directory`` up to (not including) the root."""
        while directory != self.root and self.root in directory.parents:
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent

    def _scan(self, prefix: str, start_after: str | None) -> list[ObjectInfo]:
        head, _, _ = prefix.rpartition("/")
        if head:
            try:
                base = self._path(head)
            except StorageError:
                return []
            rel = head + "/"
        else:
            base, rel = self.root, ""
        found: list[ObjectInfo] = []
        self._walk(base, rel, prefix, start_after, found)
        found.sort(key=lambda info: info.key)
        return found

    def _walk(
        self, directory: Path, rel: str, prefix: str, start_after: str | None, out: list[ObjectInfo]
    ) -> None:
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if entry.name.startswith(INTERNAL):
                continue
            key = rel + entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                sub = key + "/"
                # every key below starts with ``sub`` and sorts before ``key + "0"``
                if not (sub.startswith(prefix) or prefix.startswith(sub)):
                    continue
                if start_after is not None and start_after >= key + "0":
                    continue
                self._walk(Path(entry.path), sub, prefix, start_after, out)
            elif key.startswith(prefix) and (start_after is None or key > start_after):
                try:
                    out.append(self._info(key, entry.path))
                except (FileNotFoundError, IsADirectoryError):
                    continue  # deleted while listing

    def _info(self, key: str, path: str) -> ObjectInfo:
        """The file's metadata; its ETag is hashed once per (inode, mtime, size), as objects are
        replaced, never edited in place."""
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            cached = self._etags.get(path)
            if cached is not None and cached[0] == stamp:
                etag = cached[1]
            else:
                etag = _md5_etag(fh.read())
                if len(self._etags) >= 100_000:
                    self._etags.clear()
                self._etags[path] = (stamp, etag)
        return ObjectInfo(key, st.st_size, etag, st.st_mtime)

    # -- ObjectStore --------------------------------------------------------------------------

    async def get(self, key: str) -> Blob | None:
        found = await asyncio.to_thread(self._read, key)
        self.stats.count("GET", received=len(found[0]) if found else 0)
        if found is None:
            return None
        data, mtime = found
        return Blob(data, _md5_etag(data), mtime)

    async def head(self, key: str) -> ObjectInfo | None:
        found = await asyncio.to_thread(self._read, key)
        self.stats.count("HEAD")
        if found is None:
            return None
        data, mtime = found
        return ObjectInfo(key, len(data), _md5_etag(data), mtime)

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        self.stats.count("PUT", sent=len(data))
        return await asyncio.to_thread(self._put, key, bytes(data), if_none_match, if_match)

    async def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            self.stats.count("DELETE")
            await asyncio.to_thread(self._delete, keys[start : start + 1000])

    async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        found = await asyncio.to_thread(self._scan, prefix, start_after)
        for page in range(0, max(len(found), 1), 1000):
            self.stats.count("LIST")
            for info in found[page : page + 1000]:
                yield info

    async def list_prefixes(self, prefix: str, delimiter: str = "/") -> builtins.list[str]:
        """The common prefixes one level below ``prefix`` (directories holding at least one object)."""
        self.stats.count("LIST")
        return await asyncio.to_thread(self._prefixes, prefix, delimiter)

    def _prefixes(self, prefix: str, delimiter: str) -> builtins.list[str]:
        if delimiter != "/" or (prefix and not prefix.endswith("/")):
            # Not one directory level: derive from the full listing.
            found = {
                prefix + info.key[len(prefix) :].split(delimiter, 1)[0] + delimiter
                for info in self._scan(prefix, None)
                if delimiter in info.key[len(prefix) :]
            }
            return sorted(found)
        try:
            base = self._path(prefix.rstrip("/")) if prefix else self.root
            entries = list(os.scandir(base))
        except (StorageError, FileNotFoundError, NotADirectoryError):
            return []
        return sorted(
            prefix + entry.name + "/"
            for entry in entries
            if not entry.name.startswith(INTERNAL)
            and entry.is_dir(follow_symlinks=False)
            and self._has_object(Path(entry.path))
        )

    def _has_object(self, directory: Path) -> bool:
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return False
        dirs = []
        for entry in entries:
            if entry.name.startswith(INTERNAL):
                continue
            if entry.is_dir(follow_symlinks=False):
                dirs.append(entry)
            else:
                return True
        return any(self._has_object(Path(d.path)) for d in dirs)

    async def now(self) -> float:
        """The filesystem's clock: the mtime of a file written now (an internal temporary, removed
        at once). The kernel of the machine holding the files stamps mtimes (the server's, on a
        network filesystem), which need not be this process's ``time.time()``."""
        self.stats.count("HEAD")
        return await asyncio.to_thread(self._now)

    def _now(self) -> float:
        self._ensure_root()
        tmp = self._write_tmp(self.root / _LOCK_DIR, b"")
        try:
            return os.stat(tmp).st_mtime
        except OSError as exc:
            raise StorageError(f"file backend: cannot read the clock at {tmp}: {exc.strerror}") from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    async def close(self) -> None:
        return None
