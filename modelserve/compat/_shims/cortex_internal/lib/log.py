"""``from cortex_internal.lib.log import logger``: modelserve's user logger under Cortex's import path.

Its lines carry the request id and the API, and ``extra={...}`` fields land in the JSON line with
``--log-format json``, as Cortex's structured logging did.
"""

from modelserve.logs import logger

__all__ = ["logger"]
