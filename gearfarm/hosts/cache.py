"""A worker host's cache of build artifacts' archives, by their sha256: the test jobs of one build
on one host download its archive once, not once per suite. A target's suites all read the same
archive, so without it a night of 49 suites a target fetched each artifact 49 times from S3 (two
requests and the whole transfer each), the largest share of MinIO's work per job (docs/speed.md).

Content-addressed, so an entry is never stale. Nothing here is trusted: every use is checked
again against the sha256 the nightly signed into the payload, when the archive is unpacked
(s3.artifact.safe_extract), and an entry that fails is dropped and fetched again. Entries are
read-only files written by rename, never changed in place; the newest ``keep`` stay. A host's
slots fetch an archive one at a time (``fetching``), so the first fetch serves the others."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ArchiveCache:
    def __init__(self, root: Path, keep: int = 16) -> None:
        self.root = root
        self.keep = keep

    def _entry(self, sha256: str) -> Path:
        if not _SHA256.match(sha256):
            raise ValueError(f"not a sha256: {sha256[:80]!r}")
        return self.root / sha256

    def take(self, sha256: str, dest: Path) -> bool:
        """Put the cached archive of ``sha256`` at ``dest`` (a link to the same read-only file, or
        a copy across file systems); False when there is none."""
        src = self._entry(sha256)
        try:
            _link_or_copy(src, dest)
        except FileNotFoundError:
            return False
        try:
            os.utime(src)  # used: the trim keeps the recently used
        except OSError:
            pass  # trimmed by a sibling meanwhile: dest holds its own link
        return True

    @contextlib.contextmanager
    def fetching(self, sha256: str) -> Iterator[None]:
        """Held while this host fetches, checks and keeps ``sha256``'s archive: a sibling slot
        (another process) asking for it meanwhile waits and then takes it from the cache. The
        lock files are 16, by the digest's first hex digit, so none piles up: two archives that
        share one wait for each other, which costs a download's time, never a job."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / f".fetch-{self._entry(sha256).name[0]}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def add(self, sha256: str, archive: Path) -> None:
        """Keep ``archive``, whose sha256 was just verified, for the next job."""
        entry = self._entry(sha256)
        if entry.exists():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{os.getpid()}-{sha256}"
        try:
            _link_or_copy(archive, tmp)
            os.chmod(tmp, 0o444)
            os.replace(tmp, entry)
        except OSError as e:
            # A cache that cannot be written costs a download next time, never the job.
            log.warning("cannot keep artifact %s in %s: %s", sha256[:12], self.root, e)
            tmp.unlink(missing_ok=True)
            return
        self._trim()

    def drop(self, sha256: str) -> None:
        """Remove an entry that did not verify."""
        self._entry(sha256).unlink(missing_ok=True)

    def _trim(self) -> None:
        entries = []
        for p in self.root.iterdir():
            if _SHA256.match(p.name):
                try:
                    entries.append((p.stat().st_mtime, p))
                except FileNotFoundError:
                    pass
        for _, p in sorted(entries, reverse=True)[self.keep:]:
            p.unlink(missing_ok=True)


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except FileNotFoundError:
        raise
    except OSError:
        shutil.copyfile(src, dest)
