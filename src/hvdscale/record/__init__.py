"""The run record: building metrics.json, its derived blocks (summary, timing,
history), the label proof and the system description."""
