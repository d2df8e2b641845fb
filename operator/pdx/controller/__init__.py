"""The kopf operator for DisaggregatedInference.

`handlers` registers with kopf and stays thin; `reconcile` does read -> render -> apply ->
report through `kube` (the only module doing API I/O); `status`, `rollout` and `advice` are
pure policy; `rbac` holds the permissions the handlers need, for the Helm chart.
"""
