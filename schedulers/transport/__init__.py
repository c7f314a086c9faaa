"""Bytes between peers.

- `connection`: framed messages over TCP, one connection per peer pair, a priority outbox per connection.
- `txstamps`: when each frame's bytes left the host (traced runs only).
- `peers`: a job's connection set-up: listen, dial with retries, check each HELLO, turn late peers away.
"""
