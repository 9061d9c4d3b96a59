"""The mapper client library: route, batch, multicast, ack, resend."""

from mapper.client import RingClient
from mapper.words import split_words, words_of_lines

__all__ = ["RingClient", "split_words", "words_of_lines"]
