"""A test plugin of the parameter-server family: the built-in FIFO worker side under a name of its
own, so the built-in server (loaded with the plugin in its role process) serves it by its
declared `server_mode` (tests/loopback/test_plugins_loopback.py)."""
from __future__ import annotations

from schedulers.ps.fifo import FIFO


class PluginFIFO(FIFO):
    name = "plugin_fifo"
    display_name = "plugin fifo"
    display_order = 40
    baseline = False
    claims = {}
    report_sections = ()
