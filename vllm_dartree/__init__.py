"""DARTree speculative decoding as a vLLM plugin.

Importing this package is cheap and has no side effects: it imports neither torch nor vLLM.
vLLM loads the plugin through the ``vllm.general_plugins`` entry point
(:func:`vllm_dartree.plugin.register`).
"""

__version__ = "0.1.0"

METHOD_NAME = "dartree"
