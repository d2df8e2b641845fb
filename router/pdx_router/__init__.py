"""pdx-router: the KV-cache-aware router for P/D disaggregated vLLM with bidirectional KV."""

__all__ = ["__version__"]
__version__ = "0.1.0"
