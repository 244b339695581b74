"""The stop signal a job gets its checkpoint grace before the end (sbatch --signal)."""

from __future__ import annotations

STOP_SIGNAL = (
    r"^(HUP|INT|QUIT|ILL|TRAP|ABRT|BUS|FPE|KILL|USR1|SEGV|USR2|PIPE|ALRM|TERM|STKFLT|CHLD|"
    r"CONT|STOP|TSTP|TTIN|TTOU|URG|XCPU|XFSZ|VTALRM|PROF|WINCH|IO|PWR|SYS|[1-9]|[1-5][0-9]|"
    r"6[0-4])$"
)
"""As sbatch --signal takes it, without SIG: a Linux name (canonical: ABRT, not IOT) or a
number 1 to 64 (real-time signals by number)."""
