"""Write docs/configuration.md from the settings models (service/config.py): every variable,
its default and what it does, by group, then the variables that are no longer settings and
the renamed ones.

``python scripts/config_docs.py`` rewrites the page; ``--check`` only says whether it is stale
(exit status 1), as tests/test_config.py does.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.config import ENV_PREFIX, FIXED_NOW, GROUPS, RENAMED  # noqa: E402

PAGE = ROOT / "docs" / "configuration.md"


def variables() -> Iterator[tuple[str, str, str, str]]:
    """(group title, variable, default, description) of every setting, in the models' order."""
    for model in GROUPS.values():
        title = (model.__doc__ or "").strip().splitlines()[0].rstrip(".")
        for name, field in model.model_fields.items():
            default = field.get_default(call_default_factory=True)
            yield title, f"{ENV_PREFIX}{name.upper()}", _shown(default), field.description or ""


def _shown(default: object) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, list):
        return ",".join(str(item) for item in default) or "empty"
    if default == "":
        return "empty"
    if isinstance(default, Path) and str(default).startswith(tempfile.gettempdir()):
        return str(Path("$TMPDIR") / default.relative_to(tempfile.gettempdir()))
    return str(default)


def configuration_markdown() -> str:
    """docs/configuration.md: every variable, its default and what it does, by group."""
    lines = [
        "# Configuration",
        "",
        "<!-- Generated from the settings models (service/config.py) by "
        "`python scripts/config_docs.py`; do not edit by hand. -->",
        "",
        "Every setting is an environment variable prefixed with `MT_`. "
        "`python -m service --host/--port/--model-dir/--log-level` override the matching ones.",
    ]
    group = None
    for title, name, default, description in variables():
        if title != group:
            group = title
            lines += [
                "",
                f"## {title}",
                "",
                "| Variable | Default | What it does |",
                "|---|---|---|",
            ]
        text = description.replace("|", "\\|")
        lines.append(f"| `{name}` | `{default}` | {text} |")
    lines += [
        "",
        "## No longer settings",
        "",
        "These are fixed bounds, named constants beside the code that uses "
        "them with their reasons; a value set for them is ignored, with a warning at start-up.",
        "",
    ]
    lines += [f"- `{ENV_PREFIX}{name}`: {where}" for name, where in FIXED_NOW.items()]
    lines += [
        "",
        "## Renamed",
        "",
        "One name per concept; the earlier names still work, with a warning at start-up, and "
        "a new name set beside its old one wins.",
        "",
    ]
    lines += [f"- `{ENV_PREFIX}{old}`: now `{ENV_PREFIX}{new}`" for old, new in RENAMED.items()]
    return "\n".join(lines) + "\n"


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
