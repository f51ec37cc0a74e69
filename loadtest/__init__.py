"""Load tests for the translation service: open loop, closed loop, rate sweep, Locust.

Not a test suite: these scripts send traffic to a running service (loopback by default),
print a summary and write ``loadtest/results/NAME.json`` and a PNG plot. See
``loadtest/README.md`` for the commands.
"""
