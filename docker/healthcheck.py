#!/usr/bin/env python3
"""Container health probe: exit 0 when GET http://127.0.0.1:$MT_PORT<path> answers 2xx.

Installed as /usr/local/bin/mt-healthcheck. Standard library only, so the images need no curl
or wget. Usage: ``mt-healthcheck /health`` (liveness, the Dockerfile HEALTHCHECK) or
``mt-healthcheck /ready`` (model loaded and warmed up, what docker-compose.yml waits for).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else "/health"
    port = os.environ.get("MT_PORT", "8000")
    # Loopback: the service binds MT_HOST=0.0.0.0 in the images, which includes 127.0.0.1.
    url = f"http://127.0.0.1:{port}{path}"
    timeout_s = float(os.environ.get("MT_HEALTHCHECK_TIMEOUT_S", "4"))
    # An empty ProxyHandler: HTTP(S)_PROXY set for outbound traffic must not capture the probe.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as response:
            healthy = 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError) as error:
        print(f"unhealthy: GET {url}: {error}", file=sys.stderr)
        return 1
    if not healthy:
        print(f"unhealthy: GET {url}: HTTP {response.status}", file=sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
