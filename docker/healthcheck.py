"""The server image's HEALTHCHECK: exit 0 when the lab says it is ready, else 1.

    python3 docker/healthcheck.py            # GET http://127.0.0.1:8000/api/health
    CRASHDRILL_HEALTH_URL=http://127.0.0.1:8123/api/health python3 docker/healthcheck.py

Only the standard library: it runs inside the image, and in docker/test.sh on the host.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8000/api/health"


def main() -> int:
    url = os.environ.get("CRASHDRILL_HEALTH_URL") or DEFAULT_URL
    try:
        with urllib.request.urlopen(url, timeout=4) as r:
            body = json.load(r)
    except (OSError, ValueError) as e:  # refused, timed out, 503, not JSON
        print(f"not ready: {url}: {e}", file=sys.stderr)
        return 1
    if body.get("ready") is not True:
        print(f"not ready: {url} answered {body}", file=sys.stderr)
        return 1
    print(f"ready: {body.get('database')} schema {body.get('schema_version')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
