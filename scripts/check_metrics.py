"""Parse a Prometheus exposition (stdin) with the Prometheus project's own parser for its format
(OpenMetrics when it ends with `# EOF`, else the classic text format) and report each family's
type, as JSON on stdout; exit 1 with the reason on stderr when it does not parse.

    python scripts/check_metrics.py < metrics.txt
"""
import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as prometheus


def families(parse, text):
    out = {}
    for family in parse(text):
        if family.name in out:
            raise ValueError(f"family {family.name} appears twice")
        out[family.name] = {
            "type": family.type,
            "documentation": family.documentation,
            "samples": len(family.samples),
        }
    return out


def main():
    text = sys.stdin.read()
    try:
        if text.rstrip().endswith("# EOF"):
            result = {"format": "openmetrics", "families": families(openmetrics, text)}
        else:
            result = {"format": "prometheus", "families": families(prometheus, text)}
    except Exception as e:  # the parsers raise ValueError and friends
        print(f"does not parse: {e}", file=sys.stderr)
        sys.exit(1)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
