"""floe-ring's public Python API: the ring client, the errors it raises, the base
class of reducers, and the helpers mappers use."""

from floering.mapper.aclient import AsyncRingClient
from floering.mapper.client import RingClient
from floering.mapper.words import split_words, words_of_lines
from floering.node.core.epochs import MAX_POSITION, epoch_seq, epoch_source
from floering.mapper.scanning import FoldDuringScan
from floering.node.core.errors import (FloeError, InvalidArgument, InvalidKey, RangeLost,
                                       ReducerMismatch, StaleRing, Unavailable)
from floering.node.core.reducers import Reducer
from floering.node.transport.tls import TlsFiles

# What a user needs, in one place: the clients (sync and asyncio), the errors they raise,
# their credentials on a TLS ring, the reducer base class (it lives in the node's core, which runs it),
# and the (source, seq) numbering of epoch sources that makes Spark's retries
# exactly-once.
__all__ = ["RingClient", "AsyncRingClient", "split_words", "words_of_lines", "FloeError",
           "InvalidArgument", "InvalidKey", "RangeLost", "ReducerMismatch", "StaleRing", "Unavailable", "FoldDuringScan",
           "MAX_POSITION", "epoch_seq", "epoch_source", "TlsFiles", "Reducer"]
