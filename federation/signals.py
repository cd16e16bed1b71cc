"""What the federation tells the floors above it, without knowing who listens.

``job_finished`` is sent (``sender=FederatedJob``, ``job=…``) when the SuperLink's end of a job's run
has been recorded (``federation.services.job_reconcile``: COMPLETED, FAILED or STOPPED), inside the
transaction that records it. A receiver that starts work puts it on ``transaction.on_commit``; an
app above connects its receivers in its ``AppConfig.ready()`` (accounting: its chain of steps, ADR 0016).
"""

from django.dispatch import Signal

job_finished = Signal()

#: Sent (``sender=FederatedJob``, ``job=…``, ``from_round=k``) inside the transaction that queues
#: a FAILED job to resume from its round-``k`` checkpoint (``federation.services.job_resume``),
#: or a preempted job whose stopped run has ended (``job.status`` STOPPED there, ``k`` may be 0;
#: ADR 0035), with the job's row locked and *before* anything of its ended run is changed or
#: deleted (the metering of rounds after ``k``, the run's id and end): the floors above may close
#: out and reopen what they record of its ended run (accounting records that run's usage and
#: reopens its steps, ADR 0028). A receiver may refuse the resume by raising ``JobError``.
job_resumed = Signal()
