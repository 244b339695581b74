"""How long the evidence of a job's end is waited for and counted: the health of its nodes
(their state, their recorded down / drain / fail events) and accounting's record of the end.
Read by the adapter's observe and by classify.event_in_run's callers."""

from __future__ import annotations

from datetime import timedelta

# Ends that the health of the job's nodes can explain (or, for NODE_FAIL, name the culprit of).
NODE_EVIDENCE_STATES = {"FAILED", "NODE_FAIL", "BOOT_FAIL"}
# How long after a job's end its nodes' troubles still count: slurmctld declares a node whose
# slurmd died DOWN only after SlurmdTimeout (300 s by default), and meanwhile the job's script
# may already have failed. Beyond this the node's current state says nothing about the job.
NODE_EVIDENCE_WINDOW = timedelta(seconds=600)
# How long after a job's end a node event may begin and still count as this job's: both times
# are slurmctld's, in whole seconds, taken in the same handling of the node's failure (the
# job's end is the node's "down" or a moment after it), so a little slack covers the
# recording. Not more: an event a minute after the end is the next job's (a node that failed
# after the job's script did is still down when the end is seen, which the current state
# tells, see NODE_EVIDENCE_WINDOW).
NODE_EVENT_SLACK = timedelta(seconds=10)
# How long the judgment of such an end may wait for accounting to record it (and the node
# events before it): slurmdbd lags slurmctld by a second or so, more on a busy machine.
END_EVIDENCE_WAIT = timedelta(seconds=60)
