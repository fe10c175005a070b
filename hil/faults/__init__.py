"""Fault machinery: the network namespace (``netns``), the upstream mosquitto
(``upstream``) and the schedule that fires a scenario's faults (``schedule``)."""
