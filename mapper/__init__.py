"""The mapper client library: route, batch, multicast, ack, resend."""

from mapper.client import RingClient
from mapper.words import split_words, words_of_lines
from node.core.epochs import MAX_POSITION, epoch_seq, epoch_source
from node.core.errors import (FloeError, InvalidArgument, InvalidKey, RangeLost, ReducerMismatch,
                              StaleRing, Unavailable)
from node.transport.tls import TlsFiles

# What a mapper's user needs, in one place: the client, the errors it raises, its
# credentials on a TLS ring, and the (source, seq) numbering of epoch sources that
# makes Spark's retries exactly-once.
__all__ = ["RingClient", "split_words", "words_of_lines", "FloeError", "InvalidArgument",
           "InvalidKey", "RangeLost", "ReducerMismatch", "StaleRing", "Unavailable",
           "MAX_POSITION", "epoch_seq", "epoch_source", "TlsFiles"]
