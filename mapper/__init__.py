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

# The node's shared vocabulary only: the wire (batches, codec, errors, epochs, ring,
# hashing, TLS files, channels, statuses), the ring's balancer, shared keys' pieces,
# the hot-key sketch and the reducers (a read of a shared key merges its pieces).
__may_import__ = (
    "floering.mapper", "floering.v1", "floering.node.core.ring", "floering.node.core.hashing",
    "floering.node.core.batch", "floering.node.core.codec", "floering.node.core.errors",
    "floering.node.core.epochs", "floering.node.core.balancers", "floering.node.core.pieces",
    "floering.node.core.reducers", "floering.node.core.sketch", "floering.node.transport.status",
    "floering.node.transport.tls", "floering.node.transport.channels", "*")

# What a user needs, in one place: the clients (sync and asyncio), the errors they raise,
# their credentials on a TLS ring, the reducer base class (it lives in the node's core, which runs it),
# and the (source, seq) numbering of epoch sources that makes Spark's retries
# exactly-once.
__all__ = ["RingClient", "AsyncRingClient", "split_words", "words_of_lines", "FloeError",
           "InvalidArgument", "InvalidKey", "RangeLost", "ReducerMismatch", "StaleRing", "Unavailable", "FoldDuringScan",
           "MAX_POSITION", "epoch_seq", "epoch_source", "TlsFiles", "Reducer"]
