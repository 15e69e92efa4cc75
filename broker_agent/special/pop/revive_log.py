"""Where the POP parts write their CK and ACK records: the revive topic.

A master appends them to its own revive queue.  An acting slave cannot write its
store: its records are escaped with ``put_message_to_specific_queue``, which sends
every record of this slave for the revive topic to the same live master and queue;
that master revives them and reads the bodies back from this group.
"""

from __future__ import annotations

from collections.abc import Callable

from broker_agent.special.pop.records import revive_topic
from broker_agent.special.ports import CorePort, EscapePort, WritePort
from ha_controller.protocol.properties import PROPERTY_POP_KEY, PROPERTY_TAGS

__all__ = ["ReviveLog"]


class ReviveLog:
    """Stores CK/ACK records and issues the pop times that key the CKs."""

    def __init__(
        self,
        core: CorePort,
        write_path: WritePort,
        escape: EscapePort,
        clock: Callable[[], int],
    ) -> None:
        self.core = core
        self.write_path = write_path
        self.escape = escape
        self.topic = revive_topic(core.cfg.cluster)
        self._clock = clock
        self._last_pop_ms = 0

    def pop_time(self) -> int:
        """The pop time of a new checkpoint: now, but strictly after the last one this
        broker issued, because it is part of the checkpoint key (two checkpoints of
        one queue and start offset in the same millisecond would share a key, and an
        ack of one would mark the other done)."""
        self._last_pop_ms = max(self._clock(), self._last_pop_ms + 1)
        return self._last_pop_ms

    async def write(
        self,
        body: bytes,
        tag: str,
        key: str,
        kind: str,
        to_group: str = "",
        to_queue: int | None = None,
        *,
        confirm: bool = False,
    ) -> tuple[int, bool, str]:
        """Store a CK/ACK record: our own revive queue on a master, else escaped (to
        ``to_group``'s revive queue ``to_queue`` when named: where the CK an ACK is for
        lies).  Returns (revive queue id, stored locally, the group that holds it).
        ``confirm``: stored locally, it is answered only once the sync-state set holds
        it (``WritePort.confirm_answer``; an ACK)."""
        core = self.core
        props = {PROPERTY_TAGS: tag, PROPERTY_POP_KEY: key}
        own = core.cfg.broker_name
        if core.acting.is_master and to_group in ("", own):
            qid = 0 if to_queue is None else to_queue
            stored = self.write_path.append_local(self.topic, qid, body, props)
            if confirm:
                await self.write_path.confirm_answer(stored.physical_offset + stored.size, kind)
            return qid, True, own
        result = await self.escape.put_message_to_specific_queue(
            self.topic, body, props, kind=kind, to_group=to_group, to_queue=to_queue
        )
        return result.queue_id, False, result.group or result.target
