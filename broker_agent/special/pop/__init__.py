"""POP consumption: pop / ack / change-invisible-time with checkpoints, and the revive
service, along RocketMQ's seams:

- :mod:`.records`: receipt handles, checkpoint (CK) and ACK records (plain);
- :mod:`.order`: the batches of orderly POP (plain, ConsumerOrderInfoManager);
- :mod:`.revive_log`: where CK and ACK records are written (the revive topic);
- :mod:`.receive`: POP_MESSAGE (PopMessageProcessor);
- :mod:`.ack`: ACK_MESSAGE (AckMessageProcessor);
- :mod:`.invisible`: CHANGE_MESSAGE_INVISIBLETIME (ChangeInvisibleTimeProcessor);
- :mod:`.revive`: the revive loop (PopReviveService);
- :mod:`.service`: :class:`PopService`, which puts them together.

On an acting slave CK and ACK records cannot go to its own store: they are escaped to
one deterministic live master, which revives them and reads the bodies back from this
group; the POP ack table (:mod:`broker_agent.metadata.pop_acks`) carries what has no
record to the returning master.
"""

from broker_agent.special.pop.order import OrderLocks
from broker_agent.special.pop.records import Checkpoint, ReceiptHandle, revive_topic
from broker_agent.special.pop.revive import ReviveState
from broker_agent.special.pop.service import PopService
from ha_controller.protocol.properties import REVIVE_GROUP, retry_topic

__all__ = [
    "REVIVE_GROUP",
    "Checkpoint",
    "OrderLocks",
    "PopService",
    "ReceiptHandle",
    "ReviveState",
    "retry_topic",
    "revive_topic",
]
