from harness.monitors.detectors import Alert
from harness.monitors.monitor import Monitor, held_back, stop_reason, unwritten

__all__ = ["Alert", "Monitor", "held_back", "stop_reason", "unwritten"]
