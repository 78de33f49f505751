"""Parses a Prometheus text exposition (stdin) with the official Python
client's parser and prints its samples as JSON lines: {"name", "labels",
"value"}. A malformed exposition makes the parser, and so this script, fail.
Run by the Rust test `metrics::the_metrics_endpoint_is_valid_prometheus_text`."""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families

for family in text_string_to_metric_families(sys.stdin.read()):
    for sample in family.samples:
        print(json.dumps({"family": family.name, "type": family.type, "name": sample.name,
                          "labels": sample.labels, "value": sample.value}))
