"""The parameter server's role process: `python -m workloads.server ROLE_SPEC.json`.

The server itself is schedulers/ps/server.py; this entry point sits above the registry, which
says what mode the run's scheduler speaks.
"""
from __future__ import annotations

import sys
from pathlib import Path

from contracts.role_spec import RoleSpec
from schedulers import registry
from schedulers.ps import server


def load_role_plugins(argv: list[str]) -> None:
    """A PS-family plugin's mode is its class's: its plugins are registered before the server
    asks the registry (workloads/worker.py does the same for workers)."""
    try:
        spec = RoleSpec.model_validate_json(Path(argv[0]).read_text())
    except (IndexError, OSError, ValueError):
        return  # server.main reports a bad spec itself
    if spec.plugins:
        from schedulers.registry.plugins import PluginError, load_plugins

        try:
            load_plugins(spec.plugins, Path(argv[0]).resolve().parent)
        except PluginError as e:
            print(f"error: {spec.name}: loading its plugins: {e}", file=sys.stderr, flush=True)
            sys.exit(1)


if __name__ == "__main__":
    load_role_plugins(sys.argv[1:])
    sys.exit(server.main(sys.argv[1:], registry.server_mode))
