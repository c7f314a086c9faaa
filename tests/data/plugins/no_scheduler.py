"""A plugin that defines no Scheduler subclass (it only imports the base)."""
from schedulers.api import Scheduler

HELPER = Scheduler
