"""Build-time check of a runtime image (run by the Dockerfile, not shipped in the image).

Fails the `docker build` when the image breaks the runtime rules: torch or onnx installed
(docs/design.md, decision 5), both or neither ONNX Runtime distribution installed (one overwrites
the other's `onnxruntime` module), the wrong ONNX Runtime flavour for the target, or the
service package not importable.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import sys

ORT_DISTRIBUTIONS = {"cpu": "onnxruntime", "gpu": "onnxruntime-gpu"}
FORBIDDEN_MODULES = ("torch", "onnx", "onnxscript", "transformers")


def installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flavour", choices=sorted(ORT_DISTRIBUTIONS), required=True)
    flavour = parser.parse_args().flavour

    problems: list[str] = []
    present = [name for name in FORBIDDEN_MODULES if importlib.util.find_spec(name) is not None]
    if present:
        problems.append(f"export-time packages in the runtime image: {', '.join(present)}")

    ort_installed = [dist for dist in ORT_DISTRIBUTIONS.values() if installed(dist)]
    if ort_installed != [ORT_DISTRIBUTIONS[flavour]]:
        problems.append(
            f"expected exactly {ORT_DISTRIBUTIONS[flavour]!r} installed, found {ort_installed}"
        )

    import onnxruntime

    providers = onnxruntime.get_available_providers()
    # The GPU wheel lists CUDA even on a build host without a GPU; that is all we can check here.
    if flavour == "gpu" and "CUDAExecutionProvider" not in providers:
        problems.append(f"CUDAExecutionProvider missing from {providers}")

    # The settings module pulls pydantic-settings: a cheap check that the dependency set is whole.
    importlib.import_module("service.config")

    if problems:
        for problem in problems:
            print(f"verify_runtime: {problem}", file=sys.stderr)
        return 1
    print(f"verify_runtime: ok ({flavour}: onnxruntime {onnxruntime.__version__}, {providers})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
