"""The embedded default's outbox: each message a file in ``FRP_VAR_DIR/mail``, readable by the
portal's user alone.

Django's file backend creates its files with the process umask (0644 under the usual 022), so
while the folder is 0700, a copy, an archive or a looser folder later would hand confirmation and
password-reset links to every local user (issue 9, hostile re-test C). This backend creates each
file 0600 whatever the umask.
"""

from __future__ import annotations

import os

from django.core.mail.backends.filebased import EmailBackend


class PrivateFileEmailBackend(EmailBackend):
    """Django's file e-mail backend whose message files are created mode 0600."""

    def open(self):
        """Opens the next message file for appending, created 0600 (``O_EXCL``: a new file each
        time, as Django's names are unique). Returns ``True`` when it opened one."""
        if self.stream is None:
            fd = os.open(self._get_filename(), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            self.stream = os.fdopen(fd, "ab")
            return True
        return False
