"""The parameter server's role process: `python -m workloads.server ROLE_SPEC.json`.

The server itself is schedulers/ps/server.py; this entry point sits above the registry, which
says what mode the run's scheduler speaks.
"""
from __future__ import annotations

import sys

from schedulers import registry
from schedulers.ps import server

if __name__ == "__main__":
    sys.exit(server.main(sys.argv[1:], registry.server_mode))
