"""Silence the exporter's chatter, keep our own progress lines.

``torch.onnx.export(dynamo=True)`` warns once per call that torchvision is not installed
(its operator registry looks for torchvision's ops; this project has none), and the
onnxscript optimizer and onnx_ir passes log every pass at INFO (hundreds of lines for one
model). None of it is actionable for someone running ``make serve``; errors still show.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

# The loggers of torch's ONNX exporter and of the graph optimizer it runs.
CHATTY_LOGGERS = ("torch.onnx", "onnxscript", "onnx_ir")


@contextmanager
def quiet_exporter() -> Iterator[None]:
    """Within the block, the exporter's loggers pass only errors and its warnings are off."""
    loggers = [logging.getLogger(name) for name in CHATTY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
