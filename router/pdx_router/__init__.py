"""pdx-router: the KV-cache-aware router for P/D disaggregated vLLM with bidirectional KV."""

from . import native

__all__ = ["NATIVE", "__version__"]
__version__ = "0.1.0"

# The compiled data path, when its build matches these sources (see native.py).
NATIVE = native.state()
if NATIVE == "compiled":
    __path__.insert(0, str(native.NATIVE_DIR))
