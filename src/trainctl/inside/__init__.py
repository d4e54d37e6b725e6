"""Zero-code integrations: trainctl rides along inside the user's own training script.

When the agent runs a Python command (``trainctl run -- python train.py``) it prepends
:data:`BOOTSTRAP_DIR` to the trainer's ``PYTHONPATH``.  Its ``sitecustomize`` (stdlib only)
installs an import hook; when the script imports one of the libraries in :data:`INTEGRATIONS`,
the hook imports ``trainctl.inside.<integration>`` and calls its
``attach(module) -> str`` (a description, "ultralytics 8.4.190"), which installs trainctl
through the library's own extension points, or raises :class:`Refused` with the reason
(a version outside the tested range).  A script that imports none of them is never changed
and imports nothing of trainctl.

The pieces: ``bootstrap/sitecustomize.py`` (inside the trainer, before anything: the hook,
the chain to the user's own sitecustomize, the info events), :mod:`.launch` (the agent's
side: is this a Python command, the trainer's env), :mod:`.session` (what an integration
gets from the agent: preset, resume checkpoint, run directory), one module per integration.
"""

from __future__ import annotations

from pathlib import Path

INTEGRATIONS: dict[str, str] = {
    "ultralytics": "ultralytics",
    "transformers": "transformers",
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "torch": "plain_torch",
}
"""Top-level module the script imports -> the integration module (in this package).
``plain_torch`` is no library integration (it reports no progress): it puts the preset on
the script's DataLoaders and torch.compile, and says so under its own key
(``ATTACHED_AS``), so an integration's rules (resume, format) never take it for one."""

attached: set[str] = set()
"""The integrations attached in this process (the bootstrap adds each)."""

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"

INSTRUMENT_ENV = "TRAINCTL_INSTRUMENT"  # the bootstrap's settings (JSON); it pops it
PRESET_FILE_ENV = "TRAINCTL_PRESET_FILE"  # the preset of this attempt, a TOML file
RESUME_ENV = "TRAINCTL_RESUME_FROM"  # the checkpoint this attempt resumes from
CHECKPOINT_EVERY_ENV = "TRAINCTL_CHECKPOINT_EVERY"  # seconds between mid-epoch saves (0: off)
FLIGHT_DIR_ENV = "TRAINCTL_FLIGHT_DIR"  # torchrun: where ranks answer for their Flight Recorder
LOADER_OVERRIDE_ENV = "TRAINCTL_LOADER_OVERRIDE"  # "off": a plain script's DataLoaders are its own

# Info keys on the side channel (the agent reads the integration's name from the first).
ATTACHED_KEY = "instrument.attached"  # + "." + integration: "instrument.attached.ultralytics"
REFUSED_KEY = "instrument.refused"
FAILED_KEY = "instrument.failed"
NONE_KEY = "instrument.none"  # the agent's: none attached, console parsing
OFF_KEY = "instrument.off"  # the agent's: --no-instrument / not Python


class Refused(Exception):
    """An integration will not attach (its reason is the message): the script runs as
    written and trainctl parses its console."""


def attached_integration(key: str) -> str | None:
    """The integration named by an info key of :data:`ATTACHED_KEY`, else None."""
    prefix = ATTACHED_KEY + "."
    return key[len(prefix) :] or None if key.startswith(prefix) else None
