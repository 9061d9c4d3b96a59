"""The simulation's executor of node.core.retiring (tests/support/simulation.py inherits it):
what a removed member held is kept, asked about and handed back to a primary that holds
it as lost, by the production machine; its questions and hand-overs are calls on the
simulated network, its file a durable node's SimDisk, its round a timer, as
node/runtime/retiring.py carries them out with gRPC and asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from floering.node.core.retired import Held, held, restore_chunk
from floering.node.core.retiring import (RETIRED_CHECK, AskHeld, HeldAnswers, RestoreRefused,
                                         Restored, RestoreRetired, WriteRetired)
from floering.node.core.state_wire import decode
from floering.wire.errors import FloeError

if TYPE_CHECKING:
    from tests.support.simulation import SimProcess


class RetiringSide:
    """Methods of `Simulation` for retired ranges (it inherits them)."""

    def retire_tick(self, proc: SimProcess) -> None:
        """Every RETIRED_CHECK seconds, a round (none while one runs)."""
        if self.now < proc.retire_at or not proc.alive:
            return
        proc.retire_at = self.now + RETIRED_CHECK
        retiring = proc.machine.retiring
        if retiring.state == "idle":
            self.run_retiring(proc, retiring.start(proc.core, self.now))

    def run_retiring(self, proc: SimProcess, effects: list) -> None:
        for e in effects:
            match e:
                case AskHeld():
                    self._ask_held(proc, e)
                case RestoreRetired():
                    self._restore(proc, e, 1)
                case _:
                    self._run(proc, [e])

    def write_retired(self, proc: SimProcess, e: WriteRetired) -> None:
        """The file that keeps a member's retired ranges: written and synced at once."""
        if proc.durable is None:
            return
        if e.ranges:
            proc.durable.disk.retired[e.member] = e.ranges
        else:
            proc.durable.disk.retired.pop(e.member, None)

    def _ask_held(self, proc: SimProcess, e: AskHeld) -> None:
        answers: list = [None] * len(e.asks)
        waiting = [len(e.asks)]

        def answered(i: int, answer: Held) -> None:
            answers[i] = answer
            waiting[0] -= 1
            if waiting[0] == 0:
                self.run_retiring(proc, proc.machine.retiring.handle(
                    HeldAnswers(tuple(answers)), self.now))

        for i, (ask, address) in enumerate(zip(e.asks, e.addresses)):
            def serve(server, ask=ask):
                if server.core.ring.stamp != e.ring_stamp:
                    return Held("", False)
                return held(server.core, ask.token, ask.want)
            self.call(proc, address, serve, lambda a, i=i: answered(i, a),
                      lambda _exc, i=i: answered(i, Held("", False)))

    def _restore(self, proc: SimProcess, e: RestoreRetired, chunk: int) -> None:
        """Chunk `chunk` of a hand-over, then the next once it is merged."""
        def serve(server):
            merged = restore_chunk(server.core, e.ring_stamp, e.token, e.member, e.retired,
                                   chunk, len(e.chunks), decode(e.chunks[chunk - 1]), None,
                                   e.watermarks if chunk == 1 else {}, self.now)
            if server.durable is not None:
                server.durable.after(server.core)
            return merged

        def merged(_held) -> None:
            if chunk < len(e.chunks):
                self._restore(proc, e, chunk + 1)
            else:
                self.run_retiring(proc, proc.machine.retiring.handle(Restored(), self.now))

        def refused(exc: FloeError) -> None:
            self.run_retiring(proc, proc.machine.retiring.handle(RestoreRefused(str(exc)),
                                                                 self.now))

        self.call(proc, e.address, serve, merged, refused)
