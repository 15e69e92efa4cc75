"""Asyncio client SDK: producers, consumers, routes and admin."""

from ha_controller.acl import Credentials
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
from ha_controller.client.orderly import OrderlyPushConsumer, QueueLocker, dlq_topic
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer, PullResult, PullStatus
from ha_controller.client.push_consumer import MessageListener, PushConsumer, allocate_averagely
from ha_controller.client.routes import RouteCache, RouteListener
from ha_controller.client.send_policy import EndpointIsolation, QueueSelector
from ha_controller.client.simple_consumer import SimpleConsumer
from ha_controller.client.transaction import Transaction, TransactionChecker, TransactionResolution

__all__ = [
    "Credentials",
    "EndpointIsolation",
    "GroupInfo",
    "Message",
    "MessageIdGenerator",
    "MessageListener",
    "MessageQueue",
    "NameserverClient",
    "OrderlyPushConsumer",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueLocker",
    "QueueSelector",
    "ReceivedMessage",
    "RouteCache",
    "RouteListener",
    "SendReceipt",
    "SimpleConsumer",
    "Transaction",
    "TransactionChecker",
    "TransactionResolution",
    "allocate_averagely",
    "dlq_topic",
    "new_client_id",
    "new_message_id",
]
