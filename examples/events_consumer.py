#!/usr/bin/env python3
"""A consumer for `leasectl run --events`: one process for every bucket the node holds.

    leasectl run --group orders:16 --events -- python3 examples/events_consumer.py

Each line on stdin is an event of `leasectl worker --json`'s schema: `assigned` (start working
on the bucket, passing its token with every write the work makes) or `revoked` (stop working on
it, then acknowledge on stdout with {"ack": BUCKET, "token": TOKEN, "group": GROUP}). A revoked
bucket moves to another worker only once acknowledged; without an acknowledgement within
`--grace` the supervisor kills this process and starts it again, telling it the buckets it
still holds. Any other line on stdout is passed through.
"""

import json
import sys

held = {}  # (group, bucket) -> token

for line in sys.stdin:
    event = json.loads(line)
    key = (event["group"], event["bucket"])
    if event["event"] == "assigned":
        held[key] = event["token"]
        print(f"working on {key[0]}/{key[1]} with token {event['token']}", flush=True)
    elif event["event"] == "revoked":
        # Stop the bucket's work here (flush its state, close its consumer), then say so.
        held.pop(key, None)
        print(f"stopped {key[0]}/{key[1]} ({event['reason']})", flush=True)
        print(json.dumps({"ack": event["bucket"], "token": event["token"], "group": event["group"]}), flush=True)
