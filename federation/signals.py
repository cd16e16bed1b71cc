"""What the federation tells the floors above it, without knowing who listens.

``job_finished`` is sent (``sender=FederatedJob``, ``job=…``) when the SuperLink's end of a job's run
has been recorded (``federation.services.job_reconcile``: COMPLETED, FAILED or STOPPED), inside the
transaction that records it. A receiver that starts work puts it on ``transaction.on_commit``; an
app above connects its receivers in its ``AppConfig.ready()`` (accounting: its chain of steps, ADR 0016).
"""

from django.dispatch import Signal

job_finished = Signal()

#: Sent (``sender=FederatedJob``, ``job=…``) inside the transaction that queues a FAILED job to
#: resume from its round checkpoint (``federation.services.job_resume``): the floors above may
#: reopen what they recorded of its failed end (accounting: its steps run again when it ends).
job_resumed = Signal()
