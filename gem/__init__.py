"""GEM: a generative ads-recommendation foundation model and its transfer into
per-surface vertical models.

Stages (one package function each; `python -m gem --help` lists the CLI):
data (contract, validate, simulate, adapters) -> features -> train -> knowledge
-> distill -> pipeline / refresh.
"""

__version__ = "0.1.0"
