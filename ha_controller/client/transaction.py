"""A producer's transactions (as the RocketMQ 5 clients): one half message each, ended by
``commit()`` or ``rollback()`` (END_TRANSACTION to the group holding it), or left to the
brokers' check, whose answer the producer's :data:`TransactionChecker` gives.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from ha_controller.client.message import ReceivedMessage, SendReceipt
from ha_controller.protocol.errors import HaError

__all__ = ["EndTransaction", "Transaction", "TransactionChecker", "TransactionResolution"]

log = logging.getLogger(__name__)


class TransactionResolution(enum.Enum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


TransactionChecker = Callable[[ReceivedMessage], Awaitable[TransactionResolution]]
"""Asked by the brokers about an open transaction's half message."""


class EndTransaction(Protocol):
    """Sends END_TRANSACTION for a half message (the producer's)."""

    def __call__(self, receipt: SendReceipt, *, commit: bool) -> Awaitable[None]: ...


class Transaction:
    """One transaction holding one half message (as the RocketMQ 5 Python client).

    ``async with producer.begin_transaction() as tx``: an exception inside the block
    rolls back a sent half message; leaving the block without ``commit()`` or
    ``rollback()`` leaves the decision to the checker.
    """

    def __init__(self, end: EndTransaction) -> None:
        self._end = end
        self._receipt: SendReceipt | None = None
        self._resolution: TransactionResolution | None = None

    def ended_by(self, end: EndTransaction) -> bool:
        """Whether ``end`` (a producer's) is what ends this transaction."""
        return self._end == end

    @property
    def receipt(self) -> SendReceipt | None:
        """The half message's receipt, once sent."""
        return self._receipt

    @property
    def message_id(self) -> str | None:
        """The transaction id: the half message's client message id (UNIQ_KEY)."""
        return None if self._receipt is None else self._receipt.uniq_key

    @property
    def resolution(self) -> TransactionResolution | None:
        return self._resolution

    def _add_half(self, receipt: SendReceipt) -> None:
        if self._receipt is not None:
            raise RuntimeError("a transaction holds one message")
        self._receipt = receipt

    def _check_open(self) -> SendReceipt:
        if self._receipt is None:
            raise RuntimeError("no message was sent in this transaction")
        if self._resolution is not None:
            raise RuntimeError(f"transaction already ended ({self._resolution.value})")
        return self._receipt

    async def commit(self) -> None:
        receipt = self._check_open()
        await self._end(receipt, commit=True)
        self._resolution = TransactionResolution.COMMIT

    async def rollback(self) -> None:
        receipt = self._check_open()
        await self._end(receipt, commit=False)
        self._resolution = TransactionResolution.ROLLBACK

    async def __aenter__(self) -> Transaction:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None and self._receipt is not None and self._resolution is None:
            try:
                await self.rollback()
            except (HaError, OSError) as err:
                log.warning("rollback of transaction %s failed: %s", self.message_id, err)
