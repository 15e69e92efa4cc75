"""Asyncio client SDK: producers, consumers, routes and admin (DESIGN.md section 6)."""
