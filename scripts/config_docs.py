"""Write docs/configuration.md from the settings models (service/config.py).

``python scripts/config_docs.py`` rewrites the page; ``--check`` only says whether it is stale
(exit status 1), as tests/test_config.py does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.config import configuration_markdown  # noqa: E402

PAGE = ROOT / "docs" / "configuration.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    args = parser.parse_args(argv)
    text = configuration_markdown()
    if args.check:
        stale = not PAGE.is_file() or PAGE.read_text() != text
        print(f"{PAGE.relative_to(ROOT)} is {'stale' if stale else 'current'}")
        return int(stale)
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
