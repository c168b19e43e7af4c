"""Example databases for campaigns: a local folder, or a Redis server shared by a fleet
and multiplexed with a local folder.

``open_database(local, shared)`` gives what a campaign, a property test or the pytest
plugin hands Hypothesis:

* neither: no database;
* ``local`` only (a folder): ``DirectoryBasedExampleDatabase(local)``;
* ``shared`` (``redis://HOST:PORT[/N]``): every save goes to both the local folder
  (``local``, default ``.overlapcheck/hypothesis-db``) and the Redis server, and a
  fetch reads both, so a failing example one machine saved is replayed by every other
  that shares the server.

The server is asked once when the database opens; an address that does not answer is
a ``SharedDatabaseError`` (one line: the command exits 2). Once running, the Redis side
is wrapped by ``FallbackDatabase``: the first connection error switches it off, says
so once (``say``), and the campaign goes on with the local folder, which has had every
save all along, so no example is lost. It is not reconnected in that process.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional
from urllib.parse import urlsplit

from hypothesis.database import (DirectoryBasedExampleDatabase, ExampleDatabase,
                                 MultiplexedDatabase)

from .options import SCHEMES, is_shared, split_specs  # noqa: F401 - the specs' parsing

DEFAULT_LOCAL = ".overlapcheck/hypothesis-db"   # the nightly profile's folder too
KEY_PREFIX = b"overlapcheck-example:"
TIMEOUT_S = 5.0     # a server that stops answering (not only one that refuses) ends too


class SharedDatabaseError(Exception):
    """A shared database that cannot be opened: a bad address, a server that does not
    answer, the ``redis`` package missing. One line."""


def _redis_errors() -> tuple:
    import redis
    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


class FallbackDatabase(ExampleDatabase):
    """An example database that may go away (a network one): the first connection
    error turns it into an empty, write-ignoring database for the rest of the process
    and calls ``say`` once with the reason. Errors other than connection errors are
    not caught."""

    def __init__(self, inner: ExampleDatabase, name: str,
                 say: Optional[Callable[[str], None]] = None, errors: tuple = (OSError,)):
        super().__init__()
        self.inner, self.name, self._say, self._errors = inner, name, say, errors
        self._lock = threading.Lock()
        self.lost: Optional[str] = None    # why it went away, once it did

    def __repr__(self) -> str:
        return f"FallbackDatabase({self.inner!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FallbackDatabase) and self.inner == other.inner

    def __hash__(self) -> int:
        return hash(self.name)

    def _lose(self, e: BaseException) -> None:
        with self._lock:
            if self.lost is not None:
                return
            self.lost = f"{type(e).__name__}: {e}".splitlines()[0]
        if self._say is not None:
            self._say(f"shared example database {self.name} lost ({self.lost}); going on "
                      f"with the local database")

    def _call(self, op: str, *args):
        if self.lost is not None:
            return None
        try:
            return getattr(self.inner, op)(*args)
        except self._errors as e:
            self._lose(e)
            return None

    def fetch(self, key: bytes):
        if self.lost is not None:
            return
        try:
            values = list(self.inner.fetch(key))
        except self._errors as e:
            self._lose(e)
            return
        yield from values

    def save(self, key: bytes, value: bytes) -> None:
        self._call("save", key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        self._call("delete", key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self._call("move", src, dest, value)

    def _start_listening(self) -> None:
        self._call("add_listener", self._broadcast_change)

    def _stop_listening(self) -> None:
        self._call("remove_listener", self._broadcast_change)


def connect_redis(url: str):
    """A Redis client for ``url`` that has answered a ping (``SharedDatabaseError``
    otherwise)."""
    try:
        import redis
    except ImportError:
        raise SharedDatabaseError(f"{url} needs the redis package: pip install "
                                  f"'overlapcheck[fleet]'") from None
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise SharedDatabaseError(f"{url!r} is not a Redis address (redis://HOST:PORT[/N])")
    try:
        client = redis.Redis.from_url(url, socket_timeout=TIMEOUT_S,
                                      socket_connect_timeout=TIMEOUT_S)
    except ValueError as e:
        raise SharedDatabaseError(f"{url!r}: {e}") from None
    try:
        client.ping()
    except _redis_errors() as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SharedDatabaseError(f"cannot reach the Redis server at {url} ({reason})") from None
    except redis.exceptions.RedisError as e:     # e.g. authentication
        raise SharedDatabaseError(f"the Redis server at {url} refused: {e}") from None
    return client


def shared_database(url: str, say: Optional[Callable[[str], None]] = None) -> FallbackDatabase:
    """The Redis database at ``url`` behind a ``FallbackDatabase``."""
    from hypothesis.extra.redis import RedisExampleDatabase
    inner = RedisExampleDatabase(connect_redis(url), key_prefix=KEY_PREFIX)
    return FallbackDatabase(inner, url, say, _redis_errors())


def open_database(local: Optional[str] = None, shared: Optional[str] = None,
                  say: Optional[Callable[[str], None]] = None) -> Optional[ExampleDatabase]:
    """The example database for a local folder and/or a shared Redis address (see the
    module's docstring). ``say`` hears, once, that the shared side went away."""
    if not shared:
        return DirectoryBasedExampleDatabase(local) if local else None
    return MultiplexedDatabase(DirectoryBasedExampleDatabase(local or DEFAULT_LOCAL),
                               shared_database(shared, say))


