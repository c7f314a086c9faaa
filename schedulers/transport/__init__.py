"""Bytes between peers.

- `connection`: framed messages over TCP, one connection per peer pair, a priority outbox per connection.
- `txstamps`: when each frame's bytes left the host (traced runs only).
"""
