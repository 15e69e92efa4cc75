"""The ``async with`` protocol of the client objects that are started and closed."""

from __future__ import annotations

from typing import Self

__all__ = ["AsyncLifecycle"]


class AsyncLifecycle:
    """``async with obj:`` awaits :meth:`start` on the way in and :meth:`aclose` on the
    way out (also when the block raises).

    Subclasses implement :meth:`aclose` (idempotent) and, when starting does anything,
    :meth:`start`.
    """

    async def start(self) -> None:
        """Nothing to start by default."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
