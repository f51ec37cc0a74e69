"""Screenshot the web page of a running service with Debian's Chromium (Playwright drives it;
no browser download), for docs/: ``python scripts/screenshot_page.py http://127.0.0.1:8000/
docs/web-page.png [--dark] [--text TEXT]``."""

from __future__ import annotations

import argparse
import tempfile

from playwright.sync_api import sync_playwright

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TEXT = (
    "Save your changes before you close the window.\n"
    "The file %s could not be opened. Do you want to try again?"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("output")
    parser.add_argument("--dark", action="store_true")
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=args.chromium,
            headless=True,
            args=FLAGS,
            viewport={"width": 1200, "height": 640},
            color_scheme="dark" if args.dark else "light",
        )
        page = context.new_page()
        page.goto(args.url)
        page.wait_for_selector("body[data-ready=true]")
        page.fill("#source-text", args.text)
        page.wait_for_function(
            "document.getElementById('text-status').textContent.startsWith('Done')",
            timeout=60_000,
        )
        page.locator("#source-text").blur()
        page.screenshot(path=args.output)
        context.close()


if __name__ == "__main__":
    main()
