"""A plugin that fails while importing, at line 6."""
from schedulers.api import Scheduler

assert Scheduler

raise RuntimeError("this plugin refuses to load")
