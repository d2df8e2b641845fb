"""What runs inside the vLLM engines: the general plugins pdx registers with vLLM (entry points
`vllm.general_plugins` in pyproject.toml) and the `vllm serve` shim of the local runtime.

Apart from the API, renderer and operator: it imports nothing of pdx but the protocol it shares
with the router (`pdx_contract`), and vLLM (in-engine).
"""
