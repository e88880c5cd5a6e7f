"""The tree variants every e2e losslessness test runs (speculative-config keys of each)."""

PAPER = {"num_speculative_tokens": 64}  # B of the paper (the plugin's default off a CPU)

VARIANTS = [
    ("pruned-cpu-defaults", {}),
    ("pruned", PAPER | {"width": 12, "top_k": 64}),
    ("fixed", PAPER | {"tree": "fixed"}),
    ("ddtree", PAPER | {"tree": "ddtree"}),
    ("domino-chain", {"tree": "chain", "correction": True, "num_speculative_tokens": 16}),
    ("dflash-chain", {"tree": "chain", "correction": False, "num_speculative_tokens": 15}),
]
