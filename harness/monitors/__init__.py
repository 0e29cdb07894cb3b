from harness.monitors.detectors import Alert
from harness.monitors.monitor import Monitor, stop_reason, unwritten

__all__ = ["Alert", "Monitor", "stop_reason", "unwritten"]
