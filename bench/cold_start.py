"""Cold import time of each function against `import boto3` plus one client, in the same run.

Each sample is a fresh Python process (as a Lambda cold start is) that imports the function's app.py
with the layer on its path and a stack-like environment, and times the import, which is everything a
cold start runs before the first event: imports, configuration, clients, Powertools. The baseline
process does `import boto3; boto3.client("dynamodb")`; "its libraries only" imports what the
interruption function cannot do without (boto3 and its two clients, pydantic, Powertools' Logger,
Metrics, batch, idempotency and parser models) and nothing of SpotGuard: no function can start faster
than its libraries. Samples of all kinds are interleaved, so that a
machine that is busier now than a moment ago weighs on each kind alike; medians are printed, with each
function's ratio to the baseline.

    .venv/bin/python bench/cold_start.py [--rounds 9] [--python /path/to/python3.13]

Goal (issue 16): the interruption function at most 1.3x the baseline. Nothing here reaches AWS:
creating clients makes no call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FUNCTIONS = ("interruptions", "task_events", "checkpoints", "jobs", "reconcile")
ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "POWERTOOLS_SERVICE_NAME": "spotguard",
    "POWERTOOLS_METRICS_NAMESPACE": "SpotGuard",
    "SPOTGUARD_CLUSTERS": "gpu-spot",
    "SPOTGUARD_LEDGER_TABLE": "spotguard-ledger",
    "SPOTGUARD_IDEMPOTENCY_TABLE": "spotguard-idempotency",
    "SPOTGUARD_CHECKPOINT_BUCKET": "spotguard-checkpoints",
    "SPOTGUARD_INTERRUPTIONS_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/interruptions",
    "SPOTGUARD_INTERRUPTIONS_DLQ_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/interruptions-dlq",
    "SPOTGUARD_SIGNAL_DOCUMENT": "spotguard-SignalDocument-0123456789AB",
    "SPOTGUARD_CHECKPOINTS_DLQ_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/checkpoints-dlq",
    "SPOTGUARD_TASK_EVENTS_DLQ_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/task-events-dlq",
    "SPOTGUARD_RETRY_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/retry",
    "SPOTGUARD_TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:spotguard",
}
TIMED = "import time; t = time.perf_counter(); {body}; print(time.perf_counter() - t)"
BASELINE = TIMED.format(body="import boto3; boto3.client('dynamodb')")
# What the interruption function cannot do without: its libraries and the two clients it needs on every
# notice, and nothing of SpotGuard. The gap between this and the function is SpotGuard's own code.
LIBRARIES = TIMED.format(
    body="import boto3; boto3.client('dynamodb'); boto3.client('ecs'); "
    "from aws_lambda_powertools import Logger, Metrics; Logger(); Metrics(); "
    "from aws_lambda_powertools.utilities.batch import BatchProcessor; "
    "from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer; "
    "from aws_lambda_powertools.utilities.parser.models import EventBridgeModel"
)
FUNCTION = TIMED.format(body="import app")


def sample(python: str, code: str, cwd: Path, pythonpath: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SPOTGUARD_"))}
    env.update(ENV, PYTHONPATH=pythonpath, PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run(
        [python, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=True, timeout=60
    )
    return float(out.stdout.strip().splitlines()[-1])


def function_cold_import(name: str, rounds: int = 3, python: str = sys.executable) -> float:
    """The median cold import of one function (seconds), over `rounds` fresh processes."""
    layer = str(REPO / "layers" / "core")
    folder = REPO / "functions" / name
    pythonpath = f"{layer}{os.pathsep}{folder}"
    return statistics.median([sample(python, FUNCTION, folder, pythonpath) for _ in range(rounds)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="samples of each kind (default 9)")
    parser.add_argument("--python", default=sys.executable, help="interpreter (default: this one)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    layer = str(REPO / "layers" / "core")
    times: dict[str, list[float]] = {
        "boto3 + 1 client": [],
        "its libraries only": [],
        **{f: [] for f in FUNCTIONS},
    }
    for _ in range(args.rounds):
        times["boto3 + 1 client"].append(sample(args.python, BASELINE, REPO, layer))
        times["its libraries only"].append(sample(args.python, LIBRARIES, REPO, layer))
        for f in FUNCTIONS:
            folder = REPO / "functions" / f
            times[f].append(sample(args.python, FUNCTION, folder, f"{layer}{os.pathsep}{folder}"))
    base = statistics.median(times["boto3 + 1 client"])
    version = subprocess.run(
        [args.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True
    ).stdout.strip()
    print(f"cold import, median of {args.rounds} fresh processes (Python {version}):")
    print(f"{'':24} {'ms':>7} {'x baseline':>11}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:24} {median * 1000:7.0f} {median / base:11.2f}")
    ratio = statistics.median(times["interruptions"]) / base
    floor = statistics.median(times["its libraries only"]) / base
    print(f"the interruption function's libraries alone (boto3, 2 clients, Powertools): {floor:.2f}x")
    own = statistics.median(times["interruptions"]) - statistics.median(times["its libraries only"])
    print(f"SpotGuard's own share of the interruption function's cold import: {own * 1000:.0f} ms")
    if floor > 1.3:
        print("the libraries alone are above 1.30x here: that floor, not SpotGuard's code, bounds the ratio")
    verdict = "met" if ratio <= 1.3 else "NOT met"
    print(f"goal: the interruption function at most 1.30x the baseline: {verdict} ({ratio:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
