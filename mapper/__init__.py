"""floe-ring's public Python API: the ring client, the errors it raises, the base
class of reducers, and the helpers mappers use."""

from typing import TYPE_CHECKING

# Names load on first use, so that a pure part (mapper.machine, mapper.outbox) imported
# by itself, as the simulation does, brings in neither gRPC nor the TLS module.
_HOMES = {
    "AsyncRingClient": "floering.mapper.aclient", "RingClient": "floering.mapper.client",
    "split_words": "floering.mapper.words", "words_of_lines": "floering.mapper.words",
    "MAX_POSITION": "floering.wire.epochs", "epoch_seq": "floering.wire.epochs",
    "epoch_source": "floering.wire.epochs", "FoldDuringScan": "floering.mapper.scanning",
    **dict.fromkeys(("FloeError", "InvalidArgument", "InvalidKey", "RangeLost",
                     "ReducerMismatch", "StaleRing", "Unavailable"), "floering.wire.errors"),
    "Reducer": "floering.node.core.reducers", "TlsFiles": "floering.wire.tls"}

if TYPE_CHECKING:
    from floering.mapper.aclient import AsyncRingClient
    from floering.mapper.client import RingClient
    from floering.mapper.words import split_words, words_of_lines
    from floering.wire.epochs import MAX_POSITION, epoch_seq, epoch_source
    from floering.mapper.scanning import FoldDuringScan
    from floering.wire.errors import (FloeError, InvalidArgument, InvalidKey, RangeLost,
                                           ReducerMismatch, StaleRing, Unavailable)
    from floering.node.core.reducers import Reducer
    from floering.wire.tls import TlsFiles


def _module(home: str):
    # Each by a constant name, so the import checks see every module this may load.
    import importlib
    return {"floering.mapper.aclient": lambda: importlib.import_module("floering.mapper.aclient"),
            "floering.mapper.client": lambda: importlib.import_module("floering.mapper.client"),
            "floering.mapper.words": lambda: importlib.import_module("floering.mapper.words"),
            "floering.mapper.scanning": lambda: importlib.import_module("floering.mapper.scanning"),
            "floering.wire.epochs":
                lambda: importlib.import_module("floering.wire.epochs"),
            "floering.wire.errors":
                lambda: importlib.import_module("floering.wire.errors"),
            "floering.node.core.reducers":
                lambda: importlib.import_module("floering.node.core.reducers"),
            "floering.wire.tls": lambda: importlib.import_module("floering.wire.tls")}[home]()


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


# floering.wire (what node and client share), and of the node's core only the batch
# format, the hot-key sketch and the reducers (a read of a shared key
# merges its pieces).
__may_import__ = (
    "floering.mapper", "floering.v1", "floering.wire",
    "floering.node.core.batch", "floering.node.core.reducers", "floering.node.core.sketch", "*")

# What a user needs, in one place: the clients (sync and asyncio), the errors they raise,
# their credentials on a TLS ring, the reducer base class (it lives in the node's core, which runs it),
# and the (source, seq) numbering of epoch sources that makes Spark's retries
# exactly-once.
__all__ = ["RingClient", "AsyncRingClient", "split_words", "words_of_lines", "FloeError",
           "InvalidArgument", "InvalidKey", "RangeLost", "ReducerMismatch", "StaleRing", "Unavailable", "FoldDuringScan",
           "MAX_POSITION", "epoch_seq", "epoch_source", "TlsFiles", "Reducer"]
