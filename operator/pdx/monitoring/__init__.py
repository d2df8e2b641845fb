"""What a platform team watches pdx with: alert rules and a Grafana dashboard, defined once.

`alerts` and `dashboard` hold the queries as data; `files` writes the committed rules file and
dashboard JSON from them (`python -m pdx.monitoring --write`), and the tests check both the
committed copies and the queries themselves (promtool, a real Prometheus).

Every query groups by the labels the scrape adds (see `LABELS`): the rendered PodMonitors copy
the pods' instance and component labels into `pdx_instance` and `pdx_component`, and a scrape
configured by hand should do the same (docs/observability.md).
"""

from __future__ import annotations

INSTANCE_LABEL = "pdx_instance"  # the DisaggregatedInference's name
COMPONENT_LABEL = "pdx_component"  # prefill, decode or router
LABELS = (INSTANCE_LABEL, COMPONENT_LABEL)
BY = f"namespace, {INSTANCE_LABEL}"  # one alert per DisaggregatedInference
