"""Tooling, not the limiter's API: the ``aiolimit`` command line (``cli.py``), the demo, the
admin commands (``admin/``) and the ACL line. Nothing here is stable. The lab (the soak, the
local servers, the audits) is ``tools/`` in the repository, not in the package.
"""
