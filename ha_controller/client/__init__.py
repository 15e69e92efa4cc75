"""Asyncio client SDK: producers, consumers, routes and admin (DESIGN.md section 6)."""

from ha_controller.client.admin import GroupInfo, NameserverClient
from ha_controller.client.message import (
    Message,
    MessageIdGenerator,
    MessageQueue,
    ReceivedMessage,
    SendReceipt,
    new_client_id,
    new_message_id,
)
from ha_controller.client.producer import EndpointIsolation, Producer, QueueSelector
from ha_controller.client.pull_consumer import PullConsumer, PullResult, PullStatus
from ha_controller.client.push_consumer import MessageListener, PushConsumer, allocate_averagely
from ha_controller.client.routes import RouteCache, RouteListener

__all__ = [
    "EndpointIsolation",
    "GroupInfo",
    "Message",
    "MessageIdGenerator",
    "MessageListener",
    "MessageQueue",
    "NameserverClient",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueSelector",
    "ReceivedMessage",
    "RouteCache",
    "RouteListener",
    "SendReceipt",
    "allocate_averagely",
    "new_client_id",
    "new_message_id",
]
