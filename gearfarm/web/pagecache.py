"""The dashboard's run pages made once: what a run page shows of its run's own results (the
report's matrix, failures, verdicts, timings) depends only on the records, which stop changing
when the night ends, while the page is read all the next day. A 5,000-job night's page took 2 s
to make from 5,000 records and 200,000 cases; made once, it is read back from here (issue #38).

Kept per dashboard process as JSON bytes, not as objects: a big night's parts are 2 MB of JSON
and ten times that as Python dicts, and a page reads them back in a few milliseconds. Bounded by
bytes, least recently read dropped first, so a dashboard open for months holds a fixed amount.
Each entry carries the version it was made from (ResultsDB.run_version): a page asks with the
version its run has now and gets nothing when the run changed since (a late record, a re-run,
the report's verdicts)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson

# Room for the pages of a few dozen big nights (a 5,000-job night's parts are 7 MB with its jobs).
BUDGET_BYTES = 256 * 1024 * 1024


class Parts:
    """A document's parts, as kept (JSON bytes) or as just made (objects), read alike: ``load``
    gives a part as objects, ``raw`` as what the JSON API writes out (a kept part's text unread,
    an orjson.Fragment). Kept bytes are never changed, so reading them needs no lock."""

    def __init__(self, blobs: dict[str, bytes] | None = None, objects: dict[str, Any] | None = None) -> None:
        self._blobs = blobs or {}
        self._objects = objects or {}

    def __contains__(self, name: str) -> bool:
        return name in self._blobs or name in self._objects

    def load(self, name: str, default: Any = None) -> Any:
        if name in self._objects:
            return self._objects[name]
        blob = self._blobs.get(name)
        return default if blob is None else orjson.loads(blob)

    def raw(self, name: str) -> Any:
        if name in self._objects:
            return self._objects[name]
        return orjson.Fragment(self._blobs[name])


class PageCache:
    """Named JSON documents with a version each, least recently read dropped past ``budget``
    bytes. Thread-safe: the dashboard serves from several threads."""

    def __init__(self, budget: int = BUDGET_BYTES) -> None:
        self.budget = budget
        self.kept = 0  # documents kept so far (made: a look found none of its version)
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, ...], tuple[str, dict[str, bytes]]] = OrderedDict()
        self._bytes = 0

    def get(self, key: tuple[str, ...], version: str, parts: tuple[str, ...],
            raw: tuple[str, ...] = ()) -> dict[str, Any] | None:
        """The parts named of the document at ``key`` made from ``version``, decoded, but those
        in ``raw``: their JSON as it is (an orjson.Fragment, written out unread by the JSON
        API); None when there is none or it was made from another version."""
        kept = self.entry(key, version)
        return None if kept is None else {p: kept.raw(p) if p in raw else kept.load(p) for p in parts}

    def entry(self, key: tuple[str, ...], version: str) -> Parts | None:
        """The document at ``key`` made from ``version``, each part read only when asked for:
        a page that needs a few parts of a big document decodes those alone (None as get)."""
        with self._lock:
            got = self._items.get(key)
            if got is None or got[0] != version:
                return None
            self._items.move_to_end(key)
            return Parts(blobs=got[1])

    def put(self, key: tuple[str, ...], version: str, doc: dict[str, Any]) -> None:
        """Keep ``doc`` (each top-level value a part, read back alone) made from ``version``."""
        self._keep(key, version, {p: orjson.dumps(v) for p, v in doc.items()})

    def _keep(self, key: tuple[str, ...], version: str, blobs: dict[str, bytes]) -> None:
        size = sum(len(b) for b in blobs.values())
        with self._lock:
            self.kept += 1
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= sum(len(b) for b in old[1].values())
            if size > self.budget:
                return
            self._items[key] = (version, blobs)
            self._bytes += size
            while self._bytes > self.budget:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= sum(len(b) for b in dropped.values())

    def text(self, key: tuple[str, ...], version: str, make: Callable[[], str]) -> str:
        """The text at ``key`` made from ``version`` (an HTML fragment), made by ``make`` and kept
        when there is none or it was made from another version."""
        with self._lock:
            got = self._items.get(key)
            if got is not None and got[0] == version:
                self._items.move_to_end(key)
                return got[1]["text"].decode()
        made = make()
        self._keep(key, version, {"text": made.encode()})
        return made

    @property
    def size(self) -> int:
        with self._lock:
            return self._bytes
