"""Realistic request bodies: short UI strings and paragraphs of software help text.

Two categories, written for this load test in English (no corpus needed):

* ``ui``: button labels, menu items, messages and prompts, some with printf/format
  placeholders and markup, as a localisation pipeline would send them;
* ``help``: multi-sentence paragraphs of help text, which the service splits into sentences
  and decodes as several rows.

Sampling is deterministic for a seed, and the category weights are configurable
(``--mix ui=0.7,help=0.3``), so two runs with the same arguments send the same texts in the
same order.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

UI_STRINGS: tuple[str, ...] = (
    "Save changes",
    "Cancel",
    "Open",
    "Close window",
    "Delete the selected files?",
    "%d files copied",
    "Undo",
    "Redo",
    "Select all",
    "Find and replace",
    "Print preview",
    "Settings",
    "Check for updates",
    "About this application",
    "Quit",
    "New folder",
    "Rename",
    "Move to trash",
    "Empty trash",
    "Are you sure you want to quit?",
    "Unsaved changes will be lost.",
    "File not found: %s",
    "Permission denied",
    "Connection timed out",
    "Retry",
    "Sign in",
    "Sign out",
    "Forgot your password?",
    "Remember me",
    "Your password must contain at least %d characters.",
    "The passwords do not match.",
    "Username",
    "Email address",
    "Invalid email address",
    "Show hidden files",
    "Sort by name",
    "Sort by date modified",
    "Zoom in",
    "Zoom out",
    "Full screen",
    "Exit full screen",
    "Downloading %s…",
    "Download complete",
    "%(count)s items selected",
    "Copy link",
    "Paste",
    "Cut",
    "Import",
    "Export as PDF",
    "Add to favorites",
    "Remove from favorites",
    "Loading…",
    "No results found",
    "Search",
    "Clear search history",
    "Keyboard shortcuts",
    "Preferences",
    "Language",
    "Dark mode",
    "Restart now",
    "Restart later",
    "An update is available.",
    "Version {0}",
    "Install",
    "Uninstall",
    "The operation completed successfully.",
    "The operation failed.",
    "Could not connect to the server.",
    "Please try again later.",
    "Disk is almost full",
    "%d of %d",
    "Page {page} of {total}",
    "Attach file",
    "Send",
    "Reply all",
    "Forward",
    "Mark as read",
    "Mark as unread",
    "Archive",
    "Move to folder",
    "Create a new account",
    "Terms of service",
    "Privacy policy",
    "Accept all cookies",
    "Manage notifications",
    "Turn off notifications",
    "Battery low",
    "Plug in your computer",
    "Insert a blank disc",
    "Eject",
    "Format disk",
    "This will erase all data on the disk.",
    "Select a printer",
    "Printing page %d",
    "<b>Warning:</b> this cannot be undone.",
    "Open in new tab",
    "Open in new window",
    "Reload page",
    "Bookmarks",
    "History",
)

HELP_PARAGRAPHS: tuple[str, ...] = (
    "To save your work, choose Save from the File menu. If the document has never been "
    "saved, you will be asked for a file name and a location. Later saves overwrite the "
    "same file.",
    "You can undo most actions by pressing Ctrl+Z. To redo an action that you undid, press "
    "Ctrl+Y. The number of steps you can undo depends on the available memory.",
    "The search box finds files by name and by content. Type at least three characters to "
    "start searching. Results are updated as you type.",
    "When you delete a file, it is moved to the trash. Files in the trash still use disk "
    "space until you empty it. You can restore a file from the trash at any time before "
    "then.",
    "If the application does not start, make sure that your graphics drivers are up to "
    "date. You can also try starting it in safe mode, which disables all extensions.",
    "Extensions add new features to the editor. To install an extension, open the "
    "Extensions panel and click Install. Some extensions require a restart.",
    "Your settings are stored in your home folder. If you reinstall the application, your "
    "settings are kept. To reset them, delete the configuration folder and restart.",
    "The backup tool copies your files to an external drive every hour. The oldest backups "
    "are deleted when the drive is full. You can exclude folders in the backup settings.",
    "To share a document, click Share and enter the email addresses of the people you want "
    "to invite. Each person can be allowed to view, comment or edit.",
    "Printing a large document can take several minutes. You can cancel a print job from "
    "the print queue. Pages that were already sent to the printer will still be printed.",
    "Keyboard shortcuts speed up common tasks. Open the list of shortcuts from the Help "
    "menu. You can change any shortcut in the preferences.",
    "A strong password is long and hard to guess. Use a mix of words, numbers and symbols. "
    "Do not use the same password for more than one account.",
    "Two-step verification protects your account even if someone learns your password. "
    "After you enter your password, you are asked for a code from your phone.",
    "When the battery is low, the computer reduces the screen brightness and stops "
    "background tasks. Connect the power adapter to continue working normally.",
    "If a web page does not load, check your network connection. Then reload the page. If "
    "the problem continues, clear the browser cache and try again.",
    "The calendar shows your events by day, week or month. Drag an event to move it to "
    "another time. Double-click an empty slot to create a new event.",
    "Notifications appear in the top right corner of the screen. You can turn them off for "
    "each application separately. Important alerts are always shown.",
    "To import contacts, choose a file in CSV or vCard format. Each contact must have a "
    "name or an email address. Duplicate contacts are merged automatically.",
    "The spelling checker underlines unknown words in red. Right-click a word to see "
    "suggestions or to add it to your personal dictionary.",
    "You can connect to a remote server over a secure connection. Enter the server address "
    "and your user name. The first time, you will be asked to confirm the server's "
    "fingerprint.",
    "Large files are uploaded in the background. You can keep working while the upload "
    "continues. If the connection is lost, the upload resumes where it stopped.",
    "The terminal lets you run commands directly. Type a command and press Enter. Use the "
    "up arrow key to repeat a previous command.",
    "When you open a file that was changed by another program, the editor asks whether to "
    "reload it. If you reload, unsaved changes in the editor are lost.",
    "The installer checks that your computer meets the system requirements. At least 2 GB "
    "of free disk space is needed. The installation takes a few minutes.",
    "To change the language of the user interface, open Preferences and select a language "
    "from the list. The change takes effect after you restart the application.",
    "Screen readers can read the text of every menu and dialog. Enable the accessibility "
    "features in the system settings. High contrast themes are also available.",
    "Automatic updates are downloaded when your computer is idle. You are asked before an "
    "update is installed. You can postpone an update for up to seven days.",
    "Each project has its own folder for source files and build outputs. Build outputs can "
    "be deleted at any time, because they are created again by the next build.",
    "The log file records errors and warnings. Attach it when you report a problem. It "
    "does not contain your passwords or the content of your documents.",
    "To compare two files, select both and choose Compare. Lines that were added are shown "
    "in green, and lines that were removed are shown in red.",
    "Templates help you create documents with a consistent layout. Choose a template when "
    "you create a new document. You can also save any document as a template.",
    "A synchronization conflict happens when the same file is changed on two devices. Both "
    "versions are kept, and the newer one gets the original name.",
    "If you forget your password, click Forgot your password on the sign-in page. We send "
    "a link to your email address. The link expires after one hour.",
    "The file manager shows previews of images and documents. Press the space bar to open "
    "a quick preview. Press it again to close the preview.",
    "You can record the screen together with the sound of your microphone. Recordings are "
    "saved in the Videos folder. The recording stops when the disk is almost full.",
    "Filters hide messages that you do not want to see in your inbox. A filter can move, "
    "label or delete messages. Filters apply to new messages only.",
    "Offline mode lets you read and edit documents without a network connection. Your "
    "changes are uploaded when you are online again.",
    "To add a printer, connect it to the computer or to the same network. Most printers "
    "are detected automatically. Otherwise, enter the printer's address by hand.",
    "Encrypted folders can only be opened with your password. If you lose the password, "
    "the files cannot be recovered. Keep a copy of your recovery key in a safe place.",
    "The activity monitor shows which programs use the processor and memory. Select a "
    "program and click Stop to end it. Unsaved work in that program is lost.",
    "Version history keeps earlier copies of your documents for thirty days. Open the "
    "history to see who changed what. You can restore any earlier version.",
    "Some features are only available to administrators. If a setting is locked, ask your "
    "administrator to change it for you.",
    "Drag files onto the window to upload them. You can also paste images directly from "
    "the clipboard. Files larger than 2 GB must be uploaded with the desktop client.",
    "The status bar at the bottom of the window shows the line and column of the cursor. "
    "Click it to jump to a line by number.",
    "When the disk is full, the application cannot save your changes. Free up space by "
    "emptying the trash or by moving large files to another drive.",
    "To connect a Bluetooth device, turn it on and make it visible. Then select it in the "
    "list of devices. Some devices ask you to enter a PIN.",
    "Reports can be exported as PDF, CSV or HTML. Charts are included in PDF and HTML "
    "exports only. Large reports are sent to you by email when they are ready.",
    "The command palette gives quick access to every command. Press Ctrl+Shift+P and start "
    "typing the name of a command. Recently used commands are listed first.",
    "You are signed out automatically after thirty minutes without activity. This protects "
    "your account on shared computers. Unsaved changes are kept as a draft.",
    'Please read the <a href="https://example.com/help">online help</a> for more '
    "information. You can also contact support from the Help menu.",
)

CATEGORIES: dict[str, tuple[str, ...]] = {"ui": UI_STRINGS, "help": HELP_PARAGRAPHS}
DEFAULT_WEIGHTS: dict[str, float] = {"ui": 0.7, "help": 0.3}


def parse_weights(spec: str) -> dict[str, float]:
    """``"ui=0.8,help=0.2"`` → ``{"ui": 0.8, "help": 0.2}``; unknown names are an error."""
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in CATEGORIES:
            raise ValueError(
                f"bad mix entry {part!r}: expected NAME=WEIGHT, NAME in {sorted(CATEGORIES)}"
            )
        weights[name] = float(value)
    return weights


@dataclass
class InputSampler:
    """Deterministic source of request bodies for ``POST /v1/translate``.

    ``texts_per_request`` > 1 sends a list of texts in one request (a client translating a
    batch of UI strings at once); ``beam_size`` and ``max_new_tokens`` are passed through
    when given.
    """

    seed: int = 0
    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    texts_per_request: int = 1
    beam_size: int | None = None
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        unknown = set(self.weights) - set(CATEGORIES)
        if unknown:
            raise ValueError(
                f"unknown input categories {sorted(unknown)}; known: {sorted(CATEGORIES)}"
            )
        if any(w < 0 for w in self.weights.values()) or sum(self.weights.values()) <= 0:
            raise ValueError("input weights must be non-negative and not all zero")
        if self.texts_per_request < 1:
            raise ValueError("texts_per_request must be at least 1")
        self._rng = random.Random(self.seed)
        self._names = [name for name, w in self.weights.items() if w > 0]
        self._category_weights = [self.weights[name] for name in self._names]

    def next_text(self) -> str:
        (category,) = self._rng.choices(self._names, weights=self._category_weights)
        return self._rng.choice(CATEGORIES[category])

    def next_payload(self) -> dict[str, Any]:
        texts = [self.next_text() for _ in range(self.texts_per_request)]
        payload: dict[str, Any] = {"text": texts[0] if self.texts_per_request == 1 else texts}
        if self.beam_size is not None:
            payload["beam_size"] = self.beam_size
        if self.max_new_tokens is not None:
            payload["max_new_tokens"] = self.max_new_tokens
        return payload

    def describe(self) -> dict[str, Any]:
        """What the results JSON records about the inputs."""
        return {
            "seed": self.seed,
            "weights": dict(self.weights),
            "texts_per_request": self.texts_per_request,
            "beam_size": self.beam_size,
            "max_new_tokens": self.max_new_tokens,
            "pool_sizes": {name: len(CATEGORIES[name]) for name in CATEGORIES},
        }
