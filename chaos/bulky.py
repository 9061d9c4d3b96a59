"""A count reducer whose every state is large: (count, `pad` bytes). With it a few
keys make a range of many megabytes, which is what the size bounds of scans,
inspections and state moved between nodes are measured with (a key itself is at
most --max-key-bytes).

    --reducer floering.chaos.bulky:PaddedCount --reducer-arg pad=4194304

On the node that applies tuples every state shares one padding object; decoded from
a checkpoint or a scan, each state holds its own `pad` bytes.
"""

from __future__ import annotations

from floering.wire.errors import InvalidArgument
from floering.node.core.reducers import Reducer


class PaddedCount(Reducer):
    def __init__(self, pad: int | str = 1 << 20) -> None:
        size = int(pad)
        if not 0 <= size <= 64 << 20:
            raise ValueError("pad must be 0 to 64 MiB")
        self.pad = b"\0" * size

    def initial(self):
        return (0, self.pad)

    def reduce(self, key, value, state):
        return (state[0] + value, self.pad)

    def merge(self, a, b):
        return (a[0] + b[0], self.pad)

    def check_values(self, values) -> None:
        if not set(map(type, values)) <= {int}:
            raise InvalidArgument("a padded count's values are ints")

    def check_states(self, states) -> None:
        for state in states:
            if type(state) not in (tuple, list) or len(state) != 2 or \
                    type(state[0]) is not int or type(state[1]) is not bytes:
                raise InvalidArgument("a padded count's state is [count, padding]")

    def sort_key(self, state):
        return state[0]

    def summary(self, state):
        return state[0]
