"""The ledger, a floor service of the core like the audit log: every app above appends its records
as leaves of one RFC 9162 Merkle tree (``portal.ledger.services.ledger_append``, in the caller's
transaction), and the platform signs C2SP checkpoints that institutions may cosign.

Pure math (``merkle``, ``checkpoint``) imports no Django. The rest reads downwards only: ``leaves``
(the leaf format and errors) and ``signer`` (the platform's key) ← ``selectors`` (reads, the cached
tree, full verification) ← ``services`` (writes) ← ``views``/``urls``.
"""
