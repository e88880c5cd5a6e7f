"""vLLM general-plugin entry point (group ``vllm.general_plugins``, name ``dartree``).

vLLM calls :func:`register` once in every process it starts, for every user of the
environment, whether or not they want dartree. It therefore installs only the request gate
(see :mod:`vllm_dartree.integration.activation`) unless this process belongs to an engine
whose parent already requested dartree.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("vllm.dartree")


def register() -> None:
    from vllm_dartree.integration import activation, gate

    activation.install_gate()
    if os.environ.get(gate.ACTIVE_ENV) == "1":
        activation.activate()
