"""The POP service: the processors of :mod:`broker_agent.special.pop` put together.

It registers POP_MESSAGE (:mod:`.receive`), ACK_MESSAGE (:mod:`.ack`),
CHANGE_MESSAGE_INVISIBLETIME (:mod:`.invisible`), the subscription group RPCs and
GET_POP_ACK_TABLE, creates the revive topic on a master, turns the revive service
(:mod:`.revive`) on and off with the special services, and hands the subscription
groups and the POP ack table to forward and reverse sync.
"""

from __future__ import annotations

from broker_agent.metadata.pop_acks import PopAckSnapshot
from broker_agent.metadata.subscriptions import (
    SubscriptionGroupConfig,
    SubscriptionGroupManager,
    subscription_group_sync,
)
from broker_agent.metadata.versioned import TableSync, VersionedTable
from broker_agent.special.clock import SYSTEM_CLOCK, Clock
from broker_agent.special.pop.ack import AckMessageProcessor
from broker_agent.special.pop.invisible import ChangeInvisibleTimeProcessor
from broker_agent.special.pop.receive import PopMessageProcessor
from broker_agent.special.pop.records import REVIVE_QUEUE_NUMS
from broker_agent.special.pop.revive import PopReviveService
from broker_agent.special.pop.revive_log import ReviveLog
from broker_agent.special.ports import CorePort, EscapePort, WritePort
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.routing import Perm, TopicConfig
from ha_controller.rpc import RequestContext

__all__ = ["PopService"]


class PopService:
    """POP_MESSAGE / ACK_MESSAGE / CHANGE_MESSAGE_INVISIBLETIME and the revive loop."""

    def __init__(
        self,
        core: CorePort,
        write_path: WritePort,
        escape: EscapePort,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.core = core
        now = clock.now_ms
        self.subscriptions = SubscriptionGroupManager(core.store_dir / "subscriptions.json")
        self.subscriptions.load(replicas=core.has_replicas)
        self.revive_log = ReviveLog(core, write_path, escape, now)
        self.revive = PopReviveService(core, write_path, escape, self.revive_log, now)
        self.receive = PopMessageProcessor(
            core, write_path, self.revive_log, self.subscriptions, now
        )
        self.ack = AckMessageProcessor(
            core, write_path, self.revive_log, self.revive, self.receive, now
        )
        self.invisible = ChangeInvisibleTimeProcessor(
            core, self.revive_log, self.ack, self.receive, now
        )
        add = core.dispatcher.add
        add(RequestCode.POP_MESSAGE, broker_pb2.PopMessageRequest, self.receive.handle)
        add(RequestCode.ACK_MESSAGE, broker_pb2.AckMessageRequest, self.ack.handle)
        add(
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
            broker_pb2.AckMessageRequest,
            self.invisible.handle,
        )
        add(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            broker_pb2.UpdateSubscriptionGroupRequest,
            self._update_group,
        )
        add(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, common_pb2.Empty, self._get_groups)
        add(RequestCode.GET_POP_ACK_TABLE, common_pb2.Empty, self._get_acks)
        core.add_special_service(self.set_active)
        topic = self.revive_log.topic
        if core.acting.is_master and core.topics.get(topic) is None:
            core.topics.upsert(
                TopicConfig(topic, REVIVE_QUEUE_NUMS, REVIVE_QUEUE_NUMS, Perm.READ | Perm.WRITE)
            )

    @property
    def active(self) -> bool:
        """The revive service runs here (master online, acting slave)."""
        return self.revive.active

    def set_active(self, active: bool) -> None:
        """Special-service hook: the revive service runs on the master and an acting slave."""
        if active and not self.revive.active:
            self.receive.started()
        self.revive.set_active(active)

    async def run(self) -> None:
        """Owned by the broker's TaskGroup: the revive loop."""
        await self.revive.run()

    # ---- subscription groups ------------------------------------------------------

    async def _update_group(
        self, ctx: RequestContext, req: broker_pb2.UpdateSubscriptionGroupRequest
    ) -> common_pb2.Empty:
        self.core.check_master_only("UPDATE_AND_CREATE_SUBSCRIPTIONGROUP")
        config = SubscriptionGroupConfig.from_pb(req.config)
        self.subscriptions.upsert(config)
        return common_pb2.Empty()

    async def _get_groups(
        self, ctx: RequestContext, req: common_pb2.Empty
    ) -> broker_pb2.SubscriptionGroupTable:
        return self.subscriptions.table_pb()

    # ---- the POP ack table ----------------------------------------------------------

    async def _get_acks(self, ctx: RequestContext, req: common_pb2.Empty) -> broker_pb2.PopAckTable:
        return self.revive.acks.to_pb()

    def tables(self) -> list[VersionedTable]:
        """The subscription groups and the POP ack table, for forward and reverse sync.

        The ack table: forward, a slave takes the master's table; reverse, a returning
        master merges the slave's acks (an ack is never undone) and revives from the
        synced state."""
        acks = self.revive.acks

        def assign(snapshot: PopAckSnapshot) -> None:
            if acks.assign(snapshot):
                acks.persist()

        def adopt(snapshot: PopAckSnapshot) -> bool:
            # merged whatever the version; True (for the log) when the slave's table
            # was at least as new as ours or added anything
            newer = snapshot.version.compare(acks.data_version) >= 0
            changed = acks.merge(snapshot)
            if changed:
                self.revive.acks_adopted()
            return newer or changed

        def describe(snapshot: PopAckSnapshot) -> str:
            acked = sum(len(e.offsets) for e in snapshot.entries.values())
            return (
                f"{acked} offsets of {len(snapshot.entries)} checkpoints, "
                f"revive offsets {snapshot.revive_offsets}"
            )

        pop_acks = TableSync(
            "pop acks",
            RequestCode.GET_POP_ACK_TABLE,
            broker_pb2.PopAckTable,
            decode=PopAckSnapshot.from_pb,
            take=assign,
            adopt=adopt,  # replace: take, the ack table as the slave has it
            describe=describe,
            # reviving (master, acting slave): the table is this broker's own
            busy=lambda: self.revive.active,
            file=acks,
        )
        return [subscription_group_sync(self.subscriptions), pop_acks]
